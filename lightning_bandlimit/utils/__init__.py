"""Small shared helpers at the bottom of the package: no torch models, no Lightning.

``validation`` (argument checks with torch-like errors), ``files`` (atomic writes),
``versions`` (the library versions a result depends on), ``tables`` (Markdown tables),
``units`` (byte units: ``MIB``, ``GIB``) and ``stats`` (Student-t intervals of a mean and of
paired differences).
Everything else in the package may import from here; nothing here imports the rest.
"""
