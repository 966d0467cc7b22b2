"""Chat surfaces: the surface port every chat platform implements (``port``), the layer
above it written once (``chat``, ``approval_press``), and one package per platform."""
