"""nbval runs of single labs: quizzes write to a temporary answer store, never the user's real one."""

import os
import tempfile

os.environ["DANTINOX_ANSWERS_DB"] = os.path.join(tempfile.mkdtemp(prefix="dantinox-answers-"), "answers.sqlite")
