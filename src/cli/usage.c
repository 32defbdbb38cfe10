/*
 * usage.c -- the help texts of `kinbox` and of each command.
 */
#include "common.h"
#include "schema.h"
#include "confval.h"
#include "hdrcodec.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static void
migrate_usage(FILE *fp)
{
        fprintf(fp, "usage: kinbox migrate -c FILE [--dry-run]\n\n"
                    "Applies kinbox's schema (inbox, offsets, "
                    "dead letters, outbox) to every database\n"
                    "the configuration names ([database] url, "
                    "each consumer's own database.url,\n"
                    "the relay's) and each handler's and relay "
                    "module's schema to its consumer's\n"
                    "database, and prints each step it applied. "
                    "Applied versions are recorded in\n"
                    "kinbox_schema_migrations; running it again "
                    "is harmless. A database whose schema\n"
                    "was written by a newer kinbox is refused "
                    "(exit 2), nothing applied.\n\n"
                    "  -c, --config FILE  configuration file "
                    "(INI)\n"
                    "  -n, --dry-run      print what would be "
                    "applied, apply nothing\n"
                    "  -h, --help         this text\n");
}

static void
prune_usage(FILE *fp)
{
        fprintf(fp, "usage: kinbox prune -c FILE [--dry-run] [--json]\n\n"
                    "Deletes inbox rows older than inbox.retention and sent "
                    "outbox rows older than\noutbox.retention ([prune] "
                    "section), prune.batch rows per statement. Only one\n"
                    "instance prunes at a time (a database lock); dead rows "
                    "and dead letters are\nnever deleted. With [relay] "
                    "source = wal or binlog, event rows created more\nthan "
                    "outbox.retention ago go too, whatever their status but "
                    "dead (the log relay\nnever marks them). --dry-run "
                    "counts what would go.\n");
}

static void
offsets_usage(FILE *fp)
{
        fprintf(fp, "usage: kinbox offsets list -c FILE [--consumer NAME] "
                    "[--topic T [--partition P]]\n"
                    "                           [--json]\n"
                    "       kinbox offsets reset -c FILE --consumer NAME "
                    "--to POSITION\n"
                    "                            [--topic T [--partition "
                    "P]] [--dry-run] [--json]\n\n"
                    "list prints, per partition, the DB watermark (next "
                    "offset to apply), Kafka's\ncommitted offset of the "
                    "group, the log's start and end, and the verdict "
                    "`kinbox\nrun` applies at assignment (it reads the "
                    "record at the watermark again to\ncheck the topic's "
                    "incarnation). A REFUSED partition is paused by "
                    "`kinbox run`\nuntil reset.\n\n"
                    "reset moves both sides to POSITION: earliest (log "
                    "start), latest (log end),\ncommitted (Kafka's), "
                    "watermark (the database's) or an offset; Kafka's "
                    "offsets\nare committed for the group, then the "
                    "watermarks set (their record identity\ncleared). "
                    "Stop the group's consumers first: Kafka refuses the "
                    "commit while\nthe group has members. --dry-run "
                    "prints the plan and changes nothing.\n");
}

void
kb_usage(FILE *fp)
{
        fprintf(
            fp,
            "usage: kinbox COMMAND [options]\n"
            "\n"
            "Commands:\n"
            "  run -c FILE        run the configured consumers (and the "
            "relay when [relay] enabled = true)\n"
            "                     until SIGTERM/SIGINT\n"
            "  migrate -c FILE    apply kinbox's schema and the configured "
            "handlers' schemas\n"
            "                     (versioned, idempotent)\n"
            "  status -c FILE     lag, inbox size, dead letters, outbox "
            "per destination\n"
            "  dead list|show|replay|discard   inspect and replay dead "
            "letters\n"
            "  outbox list|requeue|cancel|pause|resume|resend   operate the "
            "outbox\n"
            "  verify -c FILE     audit watermarks, inbox rows and the "
            "outbox (exit 1 on a gap)\n"
            "  offsets list|reset   show or move the consumers' start "
            "positions (both sides)\n"
            "  prune -c FILE [--dry-run]   delete rows past their "
            "retention\n"
            "  reconcile -c FILE  run the handlers' business checks "
            "(exit 1 on a discrepancy)\n"
            "  config-reference   print the configuration reference "
            "(Markdown)\n"
            "  version            print the version\n"
            "  help [COMMAND]     this text, or a command's help\n"
            "\n"
            "Exit status: 0 success, 1 runtime failure, 2 usage or "
            "configuration error,\n"
            "3 database unreachable (down, credentials refused, no such "
            "database: every\ncommand), 4 not found (verify: nothing to "
            "check). Admin commands take "
            "--json.\n");
}

void
kb_usage_cmd(const char *cmd, FILE *fp)
{
        if (!strcmp(cmd, "run"))
                fprintf(fp,
                        "usage: kinbox run -c FILE\n\n"
                        "Runs every [consumer.NAME] section of FILE in one "
                        "process, each a member of its\n"
                        "own consumer group with its own handler, and stops "
                        "cleanly on SIGTERM/SIGINT:\n"
                        "batches in flight finish, offsets are committed, "
                        "the groups are left.\n\n"
                        "With a [relay] section holding enabled = true, the "
                        "same process also runs the\n"
                        "outbox relay (relay.* keys without the prefix, e.g. "
                        "batch.size, lease.ms,\n"
                        "modules); a file with an enabled [relay] and no "
                        "[consumer.NAME] runs the relay\n"
                        "alone.\n\n"
                        "  -c, --config FILE  configuration file (INI)\n"
                        "  -h, --help         this text\n");
        else if (!strcmp(cmd, "migrate"))
                migrate_usage(fp);
        else if (!kb_usage_of(cmd, fp))
                kb_usage(fp);
}

static void
outbox_usage(FILE *fp)
{
        fprintf(fp, "usage: kinbox outbox list [--status "
                    "pending|sent|dead|canceled] [--destination D]\n"
                    "                          [--after ID] [--limit N] "
                    "-c FILE [--json]\n"
                    "       kinbox outbox requeue (ID | --destination D) "
                    "-c FILE   dead/canceled -> pending\n"
                    "       kinbox outbox cancel (ID | --destination D) "
                    "-c FILE    pending -> canceled\n"
                    "       kinbox outbox pause DESTINATION -c FILE      "
                    "      relays stop claiming it\n"
                    "       kinbox outbox resume DESTINATION -c FILE\n"
                    "       kinbox outbox resend --since TIME -c FILE    "
                    "      publish again rows created since\n"
                    "         TIME (UTC, 2026-12-06T05:00:00, or a "
                    "duration back from now: 2h)\n");
}

/* `kinbox status`. */
static void
status_usage(FILE *fp)
{
        fprintf(fp,
                "usage: kinbox status -c FILE [--json]\n\n"
                "Per configured consumer: lag (committed offsets vs "
                "high watermarks, asked of\nthe broker), inbox rows, "
                "dead letters by status. Per outbox destination:\n"
                "pending, age of the oldest pending row, dead, sent "
                "in the last hour, paused.\nInbox size. Dedup hits "
                "are not stored: each running `kinbox run` records\n"
                "what its consumers counted in the database every "
                "second (n/a: none runs).\nThe read-only commands (status, "
                "verify, dead list/show/discard, outbox) load\nno "
                "handler: a consumer whose handler lives in your own "
                "program is fine;\nwithout any [consumer.NAME] they "
                "report the consumers the database records.\n");
}

/* `kinbox dead`. */
static void
dead_usage(FILE *fp)
{
        fprintf(fp, "usage: kinbox dead list [--consumer NAME] [--status "
                    "dead|replayed|discarded]\n"
                    "                        [--limit N] -c FILE "
                    "[--json]\n"
                    "       kinbox dead parked [--consumer NAME] "
                    "[--limit N] -c FILE [--json]\n"
                    "       kinbox dead show ID -c FILE [--json]\n"
                    "       kinbox dead replay ID -c FILE [--wait] "
                    "[--json]\n"
                    "       kinbox dead discard ID -c FILE [--wait] "
                    "[--json]\n\n"
                    "show prints the original key, headers and payload "
                    "(text, non-printable bytes\nas \\xNN). replay runs "
                    "the consumer's configured handler on the stored "
                    "copy in\none transaction with its inbox row, as if "
                    "it arrived again, and marks the\ndead letter "
                    "replayed; a dead letter is replayed at most once. "
                    "discard marks it\ndiscarded (the row is kept).\n"
                    "With dead_letter.hold_key, list shows how many "
                    "parked messages each dead\nletter holds back "
                    "(HOLDS BACK), parked lists them, and replay and "
                    "discard\nreport how many they release: the running "
                    "consumer applies them in offset\norder. --wait "
                    "waits until it did (exit 0), or one of them failed "
                    "and\nholds the key again (exit 1).\n");
}

int
kb_usage_of(const char *cmd, FILE *fp)
{
        if (!strcmp(cmd, "status"))
                status_usage(fp);
        else if (!strcmp(cmd, "dead"))
                dead_usage(fp);
        else if (!strcmp(cmd, "outbox"))
                outbox_usage(fp);
        else if (!strcmp(cmd, "verify"))
                fprintf(fp,
                        "usage: kinbox verify -c FILE [--consumer NAME] "
                        "[--older-than 5m] [--json]\n\n"
                        "Audits each consumer: every inbox row and dead "
                        "letter lies below its partition's\nDB watermark; "
                        "Kafka's committed offset is not past the DB "
                        "watermark (offsets\ncommitted without an effect); "
                        "per partition, how many offsets have a row\n(the "
                        "rest are duplicates or pruned rows: reported, not "
                        "a gap); a start position `kinbox run` refuses "
                        "(kinbox offsets list).\nAnd the outbox: rows "
                        "pending longer than --older-than. Exit status 1 "
                        "when a\ngap is found, 4 when there was nothing to "
                        "check. Without any [consumer.NAME],\nthe consumers "
                        "recorded in the database are verified.\n");
        else if (!strcmp(cmd, "offsets"))
                offsets_usage(fp);
        else if (!strcmp(cmd, "prune"))
                prune_usage(fp);
        else if (!strcmp(cmd, "reconcile"))
                fprintf(fp,
                        "usage: kinbox reconcile -c FILE [--json]\n\n"
                        "Runs the reconciliation checks of the configured "
                        "handler modules (consumers'\nhandlers and [relay] "
                        "modules): one query per check that returns the "
                        "business\ndiscrepancies older than "
                        "reconcile.grace (e.g. a paid deposit without its "
                        "ledger\nposting). Prints every discrepancy row; "
                        "exit status 1 when there is one.\n");
        else
                return 0;
        fprintf(fp, "\nExit status: 0 ok, 1 runtime failure (verify: gap "
                    "found; reconcile: discrepancy), 2 usage or "
                    "configuration\nerror, 3 database "
                    "unreachable (down, credentials refused, no such "
                    "database),\n4 not found (verify: nothing to check).\n");
        return 1;
}
