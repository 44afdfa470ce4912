"""Configuration: what to serve and how.

settings  every setting declared once (flag, env var, config key, default,
          help); the command line, config files and the docs/settings.md table come
          from it
files     config files (Python, TOML or a uWSGI ini) read into raw values and hooks
values    the converters: text in, a typed value out, or an error that says
          what to write instead
gunicorn  what forkserve does with each of Gunicorn's settings
uwsgi     what forkserve does with each uWSGI option (an ini file's [uwsgi], or flags)
ignored   settings that would be ignored in this situation (--check-config)
loader    turns `module:app` or `module:factory(...)` into a WSGI callable
"""
