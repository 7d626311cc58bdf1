"""Tools the policy may call in multi-turn episodes, one module per job: validate (the config's entries, before
anything heavy loads), spec (load them: built-ins and dotted paths, with their JSON schemas), format (show
them to the policy, read its calls), builtin (calculator, python; sandbox, seccomp and cgroup: where python
runs), dispatch (run a reply's calls: threads and worker processes), outcomes (each call's outcome as the
message the policy reads). Import the modules themselves: this package imports none of them (spec imports transformers)."""
