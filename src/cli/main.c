/*
 * main.c -- `kinbox COMMAND ...`: the table of commands. Each command is
 * one file (cmd_NAME.c) that parses its arguments, makes library calls and
 * prints; what they share is common.h's.
 */
#include "common.h"

#include <stdio.h>
#include <string.h>

static const struct command {
        const char *name;
        int (*fn)(int argc, char **argv);
} commands[] = {
    {"run", kb_cmd_run},
    {"migrate", kb_cmd_migrate},
    {"status", kb_cmd_status},
    {"dead", kb_cmd_dead},
    {"outbox", kb_cmd_outbox},
    {"verify", kb_cmd_verify},
    {"offsets", kb_cmd_offsets},
    {"prune", kb_cmd_prune},
    {"reconcile", kb_cmd_reconcile},
    {"config-reference", kb_cmd_config_reference},
};

int
main(int argc, char **argv)
{
        if (argc < 2) {
                kb_usage(stderr);
                return KB_EX_USAGE;
        }
        const char *cmd = argv[1];
        if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") ||
            !strcmp(cmd, "help")) {
                if (argc > 2)
                        kb_usage_cmd(argv[2], stdout);
                else
                        kb_usage(stdout);
                return 0;
        }
        if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
                printf("kinbox %s\n", kinbox_version());
                return 0;
        }
        for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
                if (!strcmp(cmd, commands[i].name))
                        return commands[i].fn(argc - 1, argv + 1);
        fprintf(stderr, "kinbox: unknown command \"%s\"\n\n", cmd);
        kb_usage(stderr);
        return KB_EX_USAGE;
}
