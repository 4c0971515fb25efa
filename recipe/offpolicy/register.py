"""Recipe-side registration of verl-offpolicy for ``VERL_USE_EXTERNAL_MODULES=recipe.offpolicy.register``
(the verl-recipe convention; ``verl_offpolicy.register`` is the same without this folder)."""

import verl_offpolicy.register  # noqa: F401 - registers the estimators, losses and the offpolicy trainer mode
