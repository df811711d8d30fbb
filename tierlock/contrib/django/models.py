"""No models: the module is here because Django sends ``pre_migrate`` and
``post_migrate`` only to apps that have one (see ``apps``)."""
