"""The contract paths plugins and other front ends import (``gateway.platforms.base``,
``gateway.platforms.api_server``): faces over where the code lives now, ``gateway.adapter``
and ``gateway.surfaces``. Nothing in this tree imports them; new code imports the homes."""
