/* ktnosym -- a shared object without the kinbox_module symbol: refused. */
#include <kinbox/kinbox.h>

KINBOX_API int ktnosym_version = 1;
