"""``rlft check``: before a long run, whether it can learn.

It builds what ``rlft train`` would build from the same config, samples a few groups with the run's
sampler, scores them with the run's reward, times one update on them (then puts the weights and the
optimizer back), runs the weight sync check, and says what it found: a :class:`~rlft.check.report.Report`
(:mod:`rlft.check.measure`), its verdicts (:mod:`rlft.check.verdicts`), one rich table
(:mod:`rlft.check.render`); the command itself is :mod:`rlft.check.command`.
"""
