"""The jobs a user runs from a shell: the ``lightning-bandlimit`` command line (:mod:`.cli`),
README command 1 (:mod:`.main_job`; the table and verdict it prints: :mod:`.main_report`) and its
scenario, jobs beside a co-tenant, each in its own process (:mod:`.multitenant`: a job's spec, one
job run in-process, jobs launched as processes, one job's command line, and the report on what
they measured). Nothing here is imported by the library below it."""
