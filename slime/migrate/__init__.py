"""Importing THUDM/slime launch scripts into specs, and slime's argument names for its plug-ins.

``bashargs`` reads a launch script's words, ``slime_flags`` holds what each flag means here,
``flag_table`` classes every flag of slime's parser (``slime_flags.json``, written by
``gen_slime_flags``), ``flagmap`` maps each flag to a spec field (or refuses it), ``importer`` assembles
the spec, ``slime_args`` gives slime-signature plug-ins an ``args`` namespace built from a spec.
"""
