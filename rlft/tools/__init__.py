"""Tools the policy may call in multi-turn episodes, one module per job: check (the config's entries, before
anything heavy loads), spec (load them: built-ins and dotted paths, with their JSON schemas), format (show
them to the policy, read its calls), builtin (calculator, python), run (calls into the messages the policy
reads). Import the modules themselves: this package imports none of them (spec imports transformers)."""
