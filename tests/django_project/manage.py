"""The test project's manage.py: ``python manage.py test bank`` runs its suite."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bankproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
