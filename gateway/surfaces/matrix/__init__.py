"""The Matrix chat surface (``adapter``): a bot account on any homeserver, over /sync."""

from gateway.surfaces.matrix.adapter import MatrixAdapter, MatrixLoginRefused

__all__ = ["MatrixAdapter", "MatrixLoginRefused"]
