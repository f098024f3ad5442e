/* The text goes to promtool through a temporary file and its report comes
 * back through a pipe: popen() gives one direction only. */
#include "promtool.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void assert_promtool_clean(const char *text)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0) {
        print_message("promtool is not installed (Debian package prometheus, which "
                      "scripts/setup.sh installs): not checked\n");
        skip();
    }
    char path[] = "/tmp/kvcr-promtool-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    char cmd[128], report[4096];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t got = fread(report, 1, sizeof report - 1, p);
    report[got] = '\0';
    char rest[512]; /* read to the end: promtool would block on a full pipe */
    while (fread(rest, 1, sizeof rest, p) > 0) continue;
    int status = pclose(p);
    unlink(path);
    if (status != 0 || got != 0)
        fail_msg("promtool check metrics (exit %d) reports:\n%s\non the text:\n%s",
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1, report, text);
}
