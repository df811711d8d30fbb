"""The ``tierlock`` command and what it shows: the admin views (``admin``), ``top``, and
the demo (``demo``, ``demo_accounts``, ``demo_report``). The library never imports
them; the Django and Flask integrations use ``admin`` for their own commands."""
