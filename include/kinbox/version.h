/**
 * @file version.h
 * @brief kinbox version numbers.
 */
#ifndef KINBOX_VERSION_H
#define KINBOX_VERSION_H

#define KINBOX_VERSION_MAJOR 0
#define KINBOX_VERSION_MINOR 1
#define KINBOX_VERSION_PATCH 0

/** Integer version, 0xMMmmpp. */
#define KINBOX_VERSION_NUM                                                    \
        ((KINBOX_VERSION_MAJOR << 16) | (KINBOX_VERSION_MINOR << 8) |         \
         KINBOX_VERSION_PATCH)

#endif
