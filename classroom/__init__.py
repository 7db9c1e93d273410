"""Classroom sessions: the answer store every quiz writes to, summaries for instructors, nbgrader export.

Import-light on purpose: `import classroom` pulls in nothing heavier than the standard library; import the
submodules you need (`from classroom.store import AnswerStore`).
"""
