#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

/* The fault suite's slow disk: each fsync/fdatasync of the process first
   sleeps the microseconds written in the file $BOOKSTREAM_SLOW_DISK (none,
   or no file: no delay).  Loaded with LD_PRELOAD into a bookie. */
static long delay_us(void) {
    const char *path = getenv("BOOKSTREAM_SLOW_DISK");
    if (!path) return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[32];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    return atol(buf);
}

static void wait_slow(void) {
    long d = delay_us();
    if (d > 0) usleep((useconds_t)d);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    wait_slow();
    return real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    wait_slow();
    return real(fd);
}
