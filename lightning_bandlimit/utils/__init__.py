"""Small shared helpers at the bottom of the package: no torch models, no Lightning (but the
out-of-memory test, which recognises their errors).

``validation`` (argument checks with torch-like errors), ``files`` (atomic writes),
``versions`` (the library versions a result depends on), ``tables`` (Markdown tables),
``units`` (byte units: ``MIB``, ``GIB``), ``stats`` (Student-t intervals of a mean and of
paired differences) and ``out_of_memory`` (the one test of an out-of-memory error, for the
backstop and the split trial).
Everything else in the package may import from here; nothing here imports the rest.
"""
