"""The floor for a 12-step converge: a pyinfra deploy of 12 no-change steps (one stat fact each)."""

from pyinfra.operations import files

for i, path in enumerate(("/etc", "/opt", "/usr", "/var", "/srv", "/tmp", "/root", "/var/lib", "/var/log",
                          "/usr/local", "/usr/local/bin", "/usr/local/lib"), 1):
    files.directory(name=f"step {i}: {path}", path=path)
