/**
 * @file export.h
 * @brief Symbol visibility and C++ guards for the public API.
 */
#ifndef KINBOX_EXPORT_H
#define KINBOX_EXPORT_H

#if defined(KINBOX_STATIC)
#define KINBOX_API
#elif defined(__GNUC__)
#define KINBOX_API __attribute__((visibility("default")))
#else
#define KINBOX_API
#endif

#if defined(__GNUC__)
#define KINBOX_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KINBOX_PRINTF(f, a)
#endif

#ifdef __cplusplus
#define KINBOX_BEGIN_DECLS extern "C" {
#define KINBOX_END_DECLS }
#else
#define KINBOX_BEGIN_DECLS
#define KINBOX_END_DECLS
#endif

#endif
