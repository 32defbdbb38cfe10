/* points handler: the descriptors `kinbox run` knows as built-ins. */
#ifndef KINBOX_HANDLER_POINTS_H
#define KINBOX_HANDLER_POINTS_H
#include <kinbox/module.h>
extern const kinbox_module_t kinbox_points_module;
extern const kinbox_module_t kinbox_points_single_module;
/* Reconciliation checks (points_checks.c), NULL-name terminated. */
extern const kinbox_check_t kinbox_points_checks[];
#endif
