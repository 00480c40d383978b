"""Small shared helpers at the bottom of the package: no torch models, no Lightning.

``validation`` (argument checks with torch-like errors), ``files`` (atomic writes),
``versions`` (the library versions a result depends on) and ``tables`` (Markdown tables).
Everything else in the package may import from here; nothing here imports the rest.
"""
