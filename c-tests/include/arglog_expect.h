/* arglog_expect.h: what a test program passed, in the fake runtime's argument-log format.
 *
 * Why it exists: the fake runtimes append `libcudart.so.<major> <symbol> <param>=<value>
 * ...` to $FAKECUDA_ARGLOG for each call they receive (fake/runtime/cudart_arglog.c). A
 * program prints the same line for each call it makes, prefixed `expect `, and the result
 * `rc <symbol> <code>`; the tests compare the two, so any argument changed on the way (a
 * lost stream, a location read as a device, the other major's runtime) shows.
 * Formats: as cudart_arglog.c (scalars decimal, pointers %p, enums numbers, by-value
 * structs {field=value,...}).
 */
#ifndef ARGLOG_EXPECT_H
#define ARGLOG_EXPECT_H

#include <stdio.h>

#define EXPECT_LOG(major, symbol, ...) do { \
        printf("expect libcudart.so.%d %s ", (major), (symbol)); \
        printf(__VA_ARGS__); \
        printf("\n"); \
    } while (0)
#define REPORT_RC(symbol, err) printf("rc %s %d\n", (symbol), (int)(err))
#define LOC_FMT "{type=%d,id=%d}"
#define LOC_ARGS(l) (int)(l).type, (l).id

#endif
