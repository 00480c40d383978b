"""The jobs a user runs from a shell: the ``lightning-bandlimit`` command line (:mod:`.cli`),
README command 1 (:mod:`.main_job`) and its scenario, a job beside a co-tenant in its own
process (:mod:`.multitenant`). Nothing here is imported by the library below it."""
