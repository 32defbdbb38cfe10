/* ktwrongabi -- a module built for another descriptor ABI: refused. */
#include <kinbox/kinbox.h>

static kinbox_result_t
handle(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)tx;
        (void)msg;
        (void)opaque;
        return KINBOX_RESULT_OK;
}

KINBOX_API const kinbox_module_t kinbox_module = {
    .abi_version = 999, /* no kinbox has it */
    .name = "ktwrongabi",
    .handle = handle,
};
