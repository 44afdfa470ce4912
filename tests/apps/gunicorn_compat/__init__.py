"""Real Django, Flask and Falcon applications served from Gunicorn config files."""
