/* What one locked instruction and one clock read cost on this machine, against an ordinary
 * increment: the prices benches/perf/locked.py's counts are multiplied by (docs/perf-levers.md,
 * "What the count does not price"). Callgrind counts a locked add as one instruction and, under
 * valgrind, a clock read as a system call it does not count at all.
 *
 *   gcc -O2 benches/perf/price.c -o /tmp/price && /tmp/price
 */
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
    const long n = 50000000;
    _Atomic long shared = 0;
    volatile long plain = 0;
    struct timespec t;

    double a = now_ns();
    for (long i = 0; i < n; i++) atomic_fetch_add_explicit(&shared, 1, memory_order_relaxed);
    double b = now_ns();
    for (long i = 0; i < n; i++) plain++;
    double c = now_ns();
    for (long i = 0; i < n / 10; i++) clock_gettime(CLOCK_MONOTONIC, &t);
    double d = now_ns();

    printf("locked add   %5.2f ns\n", (b - a) / n);
    printf("plain add    %5.2f ns (a volatile increment: a load and a store)\n", (c - b) / n);
    printf("clock read   %5.2f ns (clock_gettime, CLOCK_MONOTONIC)\n", (d - c) / (n / 10));
    return 0;
}
