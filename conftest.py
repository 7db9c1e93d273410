"""nbval runs of labs (`pytest --nbval labs/X.ipynb`): quizzes write to a temporary answer store, never the user's.

Here, not beside the labs, so that learners see only notebooks in labs/.
"""

import os
import tempfile

os.environ["DANTINOX_ANSWERS_DB"] = os.path.join(tempfile.mkdtemp(prefix="dantinox-answers-"), "answers.sqlite")
