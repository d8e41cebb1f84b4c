"""Dev split, continued: the scenarios that use the `files` app (never used in training)."""

from __future__ import annotations

import sqlite3

from tasks.apptown.grading import Grader
from tasks.apptown.scenario import (
    Scenario,
    Variant,
    add_email,
    days_ago,
    ids,
    login_cell,
)
from tasks.apptown.world import World, insert_row


class FilesReadWifiPassword(Scenario):
    id = "files_read_wifi_password"
    difficulty = 1
    apps = ("files",)
    split = "dev"
    mistake = "takes the first password in the file without reading which one is current"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        rng = self.rng(world)
        params = [
            {
                "path": path,
                "old": f"{word}-{rng.randint(100, 999)}",
                "new": f"{word.upper()}{rng.randint(1000, 9999)}",
            }
            for path, word in (
                ("/home/wifi.txt", "maple"),
                ("/documents/network.txt", "harbor"),
                ("/notes/router.txt", "comet"),
            )
        ]
        wordings = (
            "What is the current Wi-Fi password written in my file {path}?",
            "Look up the Wi-Fi password in {path} (the one in use now) and tell me.",
            "My file {path} has our Wi-Fi details. What is the password that works now?",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        text = (
            f"Network: Home-{v.user_id}\nOld password (do not use): {v['old']}\n"
            f"Current password: {v['new']}\n"
        )
        insert_row(
            db,
            "files_files",
            owner_id=v.user_id,
            path=v["path"],
            content=text,
            created_at=days_ago(world, 40),
            updated_at=days_ago(world, 5),
        )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("files"),
            f'text = apis.files.show_file(path="{v["path"]}")["content"]\nprint(text)',
            'password = [line.split(": ", 1)[1] for line in text.splitlines() '
            'if line.startswith("Current password")][0]\n'
            "apis.supervisor.complete_task(answer=password)",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[2] = (
            "import re\n"
            'password = re.search(r"password[^:]*: (\\S+)", text, re.I).group(1)\n'
            "apis.supervisor.complete_task(answer=password)"
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        g.check_answer(v["new"])
        g.check_no_other_changes()


class EmailSaveAttachments(Scenario):
    id = "email_save_attachments"
    difficulty = 2
    apps = ("email", "files")
    split = "dev"
    mistake = "saves the attachments of every email from that sender"

    def variants(self, world: World) -> list[Variant]:
        users = self.pick_users(world, [p.id for p in world.society.people])
        rng = self.rng(world)
        params = []
        for user, subject in zip(
            users, ("Tax documents", "Trip itinerary", "Lease renewal"), strict=True
        ):
            sender = world.person(rng.choice(world.society.related(user, "friend")))
            params.append({"subject": subject, "name": sender.name, "sender_id": sender.id})
        wordings = (
            "Save the attachments of the email from {name} with subject '{subject}' "
            "into my files under /downloads/, keeping their file names.",
            "Download every attachment of {name}'s email '{subject}' to /downloads/ in "
            "my files (same file names).",
            "Put the files attached to the '{subject}' email that {name} sent me into my "
            "/downloads/ folder, with their original names.",
        )
        return self.make_variants(users, wordings, params)

    def setup(self, db: sqlite3.Connection, world: World, v: Variant) -> None:
        stem = v["subject"].lower().replace(" ", "_")
        add_email(
            db,
            v["sender_id"],
            v.user_id,
            v["subject"],
            "See attached.",
            days_ago(world, 4),
            attachments=(
                (f"{stem}.txt", f"{v['subject']}: page 1"),
                (f"{stem}_2.txt", f"{v['subject']}: page 2"),
            ),
        )
        add_email(
            db,
            v["sender_id"],
            v.user_id,
            "Old draft",
            "Ignore this one.",
            days_ago(world, 2),
            attachments=(("old_draft.txt", "draft"),),
        )

    def gold(self, v: Variant) -> list[str]:
        return [
            login_cell("email", "files"),
            f'emails = all_pages(apis.email.show_inbox, query="{v["subject"]}", '
            "include_archived=True)\n"
            f'email = next(e for e in emails if e["sender_name"] == "{v["name"]}" and '
            f'e["subject"] == "{v["subject"]}")\n'
            'attachments = apis.email.show_email(email_id=email["email_id"])["attachments"]\n'
            "print(attachments)",
            "for a in attachments:\n"
            '    apis.email.download_attachment(attachment_id=a["attachment_id"], '
            'path="/downloads/" + a["file_name"])',
            "apis.supervisor.complete_task()",
        ]

    def wrong(self, v: Variant) -> list[str]:
        cells = self.gold(v)
        cells[1] = (
            "emails = [e for e in all_pages(apis.email.show_inbox, include_archived=True)"
            f' if e["sender_name"] == "{v["name"]}"]\n'
            "attachments = [a for e in emails for a in apis.email.show_email("
            'email_id=e["email_id"])["attachments"]]'
        )
        return cells

    def evaluate(self, g: Grader, v: Variant) -> None:
        expected = sorted(
            (f"/downloads/{a['file_name']}", a["content"])
            for a in g.before(
                "SELECT a.* FROM email_attachments a JOIN email_emails e ON e.id = a.email_id JOIN "
                "email_recipients r ON r.email_id = e.id WHERE e.sender_id = ? AND e.subject = ? "
                "AND r.person_id = ?",
                (v["sender_id"], v["subject"], v.user_id),
            )
        )
        new = [f for f in g.diff.added("files_files") if f["owner_id"] == v.user_id]
        got = sorted((f["path"], f["content"]) for f in new)
        g.check(
            "attachments_saved",
            f"Exactly the attachments of {v['subject']!r} were saved "
            "under /downloads/ with their names and content",
            got == expected,
            f"saved {[p for p, _ in got]}, expected {[p for p, _ in expected]}",
        )
        g.check_no_other_changes({"files_files": ids(new)})


DEV_FILES: tuple[Scenario, ...] = (
    FilesReadWifiPassword(),
    EmailSaveAttachments(),
)
