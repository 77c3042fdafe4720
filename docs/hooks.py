"""MkDocs hooks: the Reference pages generated from conf/ and the code (fedagg.reference) each build.

Every folder of `conf/` becomes a page under Reference, in the navigation too, so a group added there appears with
no edit to mkdocs.yml.
"""

from __future__ import annotations

from mkdocs.structure.files import File

from fedagg import reference


def on_config(config):
    section = next(item for item in config["nav"] if isinstance(item, dict) and "Reference" in item)["Reference"]
    listed = {next(iter(entry.values())) if isinstance(entry, dict) else entry for entry in section}
    at = next(i for i, entry in enumerate(section) if isinstance(entry, dict) and "Groups at a glance" in entry) + 1
    for group in reversed(reference.groups()):
        path = f"reference/{group.replace('/', '-')}.md"
        if path not in listed:
            section.insert(at, {f"{group}": path})
    return config


def on_files(files, config):
    for path, text in reference.pages().items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=text))
    return files
