"""The results of the robustness recipe: records, checks, files and the study's verdict.

``records`` (one record per model x attack x eps, and the worst case), ``sanity`` (the sanity
checks), ``report`` (results.json / results.csv, the plot, summary.md), ``result_store`` (the
results files, rewritten after every record), ``study`` (replicates: mean +- std, paired
differences) and ``verdict`` (the verdict per threat class, the study's sections of summary.md).
"""
