"""Configuration: what to serve and how.

settings  every setting declared once (flag, env var, config key, default,
          help); the command line, config files and the README table come
          from it
loader    turns `module:app` or `module:factory(...)` into a WSGI callable
"""
