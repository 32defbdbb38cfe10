/*
 * common.h -- what the `kinbox` commands share: exit statuses, option
 * parsing, table / JSON output, the configuration-and-database context of
 * an operator command, the broker's view of a group, help texts, handler
 * modules, and each command's entry point (main.c's table). Nothing here
 * calls a command.
 */
#ifndef KINBOX_CLI_COMMON_H
#define KINBOX_CLI_COMMON_H

#include <kinbox/kinbox.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

/* Exit status of every command. */
#define KB_EX_OK 0
#define KB_EX_RUNTIME 1 /* runtime failure; verify: a gap was found */
#define KB_EX_USAGE 2 /* usage or configuration error */
#define KB_EX_DB 3 /* database unreachable */
#define KB_EX_NOTFOUND 4 /* no such id / destination */
/* The exit status of a library failure, the one mapping of every command:
 * KB_EX_DB for an unreachable database, KB_EX_USAGE for what the
 * configuration or the arguments got wrong, KB_EX_NOTFOUND, else
 * KB_EX_RUNTIME. */
int kb_exit_of(kinbox_err_t rc);

/* The commands (main.c's commands[]): argv[0] is the command. */
int kb_cmd_run(int argc, char **argv);
int kb_cmd_migrate(int argc, char **argv);
int kb_cmd_status(int argc, char **argv);
int kb_cmd_dead(int argc, char **argv);
int kb_cmd_outbox(int argc, char **argv);
int kb_cmd_verify(int argc, char **argv);
int kb_cmd_prune(int argc, char **argv);
int kb_cmd_reconcile(int argc, char **argv);
int kb_cmd_config_reference(int argc, char **argv);
int kb_cmd_offsets(int argc, char **argv);

/* Help (usage.c): the command list; a command's help (the command list
 * for an unknown one); kb_usage_of() returns 0 for an unknown command. */
void kb_usage(FILE *fp);
void kb_usage_cmd(const char *cmd, FILE *fp);
int kb_usage_of(const char *cmd, FILE *fp);

/* Handler modules (modules.c): the one configured for a consumer; one by
 * name (built in, or handler.path/NAME.so). */
const kinbox_module_t *find_module(const kinbox_conf_t *conf, char *err,
                                   size_t sz);
const kinbox_module_t *find_module_named(const kinbox_conf_t *conf,
                                         const char *name, char *err,
                                         size_t sz);
/* The module whose name records m's schema: the first built-in with the
 * same schema (points-single is the points handler per message: one
 * schema, recorded as points); m itself otherwise. */
const kinbox_module_t *kb_schema_owner(const kinbox_module_t *m);

/* A background thread's pause: waits up to ms on cond (lock taken here)
 * or until *stop, set under lock with cond signalled. True when stopped. */
bool kb_nap(pthread_mutex_t *lock, pthread_cond_t *cond,
            const volatile int *stop, int64_t ms);

/* "5m", "30s", "2h", "1d", "500ms"; bare numbers are seconds. 0 or -1. */
int kb_duration_ms(const char *s, int64_t *ms);

/* Options of the operator commands (opts.c). */
typedef struct opts {
        const char *cmd; /* "status", "dead", ... for messages */
        const char *config;
        bool json;
        bool dry_run;
        bool wait; /* dead replay/discard: until released */
        const char *consumer;
        const char *status;
        const char *destination;
        const char *older_than;
        const char *since; /* outbox resend --since */
        long limit;
        int64_t after;
        const char *topic; /* offsets: --topic */
        int32_t partition; /* offsets: --partition, -1 when not given */
        const char *to; /* offsets reset: --to */
        char *args[4];
        int nargs;
} opts_t;

/* Parse argv (argv[0] the command) into o, accepting the options whose
 * short letters are in allowed; prints the error and returns non-zero. */
int parse_opts(int argc, char **argv, opts_t *o, const char *allowed);
int parse_id(const opts_t *o, const char *s, int64_t *id);
int parse_duration_ms(const char *s, int64_t *ms);
/* The subcommand of `kinbox CMD SUB ...`: its 1-based index in subs
 * (NULL-terminated), or 0 with *exitp set: help shown, or a usage error
 * naming what was expected. */
int subcommand(const char *cmd, int argc, char **argv, const char *const *subs,
               int *exitp);

/* Output (out.c). */
/* A simple column-aligned table. */
typedef struct table {
        int ncols;
        char **cells; /* row-major, malloc'ed */
        size_t n, cap;
} table_t;
void tbl_init(table_t *t, int ncols, ...);
void tbl_add(table_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Print (fp NULL: only free) and free. */
void tbl_print(table_t *t, FILE *fp);
/* Bytes for people: \xNN for what is not printable; malloc'ed. */
char *escape_bytes(const char *p, size_t n);
/* Print one JSON document on stdout and free it. */
void json_out(json_t *j);
/* The table, or with json the array (both freed). */
void rows_out(bool json, table_t *t, json_t *ja);
/* A number as a JSON number, NULL as null, other text as a string. */
json_t *jval(const char *v);

/* An operator command's configuration and database (common.c). */
typedef struct ctx {
        opts_t o;
        kb_config_t cfg;
        bool loaded;
        kinbox_admin_t *adm;
} ctx_t;
/* Load x->o.config, open the handle, check reachability and the schema;
 * returns an exit status (printed). */
int ctx_open(ctx_t *x);
void ctx_close(ctx_t *x);
/* With no [consumer.NAME] section: the consumers the database knows
 * (kinbox_admin_consumers()) as consumers of x->cfg, each a copy of the
 * shared settings with its name and its topics (discovered set). An exit
 * status (printed). */
int ctx_discover(ctx_t *x);
/* Connect to conf's database once: KB_EX_OK; KB_EX_DB (whatever the
 * reason: down, refused credentials, no such database), printed as "kinbox
 * CMD: WHERE: database unreachable: ..."; KB_EX_USAGE for a URL that does
 * not parse. Every command maps a failed connection so. */
int kb_db_reachable(const kinbox_conf_t *conf, const char *cmd,
                    const char *where);
/* Print the handle's error; the exit status of rc. */
int db_fail(ctx_t *x, kinbox_err_t rc);
const char *rv(kinbox_rows_t *r, size_t i, int c);
/* The [consumer.NAME] section named name (its conf in *conf), or NULL. */
const char *consumer_section(ctx_t *x, const char *name, kinbox_conf_t **conf);

/* A consumer's group: its group.id, or its name (common.c). */
const char *group_of(kinbox_conf_t *conf);

/* "topic [p]: refused (name): reason; W .., C .., log L..H" of a refused
 * partition. */
void kb_start_refusal(const kinbox_offsets_partition_t *p, char *buf,
                      size_t sz);
/* Each refused partition of o: its kb_start_refusal() appended to ja and,
 * when out is not NULL, written to out as "PREFIXname: refusal". Returns
 * their number. */
int kb_start_refusals(const kinbox_offsets_t *o, json_t *ja, FILE *out,
                      const char *prefix, const char *name);

#endif
