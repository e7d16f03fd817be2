"""``rackboot setup``: the first-boot dialog on the serial console (docs/setup.md).

:mod:`.questions` holds the questions, their validation and how answers change the
configuration (pure); :mod:`.tomlwrite` writes TOML back; :mod:`.system` reads the
interfaces, writes files atomically and starts the service; :mod:`.dialog` is the
terminal and answers-file driver.
"""
