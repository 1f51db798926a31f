"""The roles: what each rank does (actor, buffer, learner and the learner group), each a class whose
turn is a list of named steps."""
