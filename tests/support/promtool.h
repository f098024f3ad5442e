/* `promtool check metrics` (Debian package prometheus, which
 * scripts/setup.sh installs) over a Prometheus text, from a cmocka test. */
#ifndef KVCR_TEST_PROMTOOL_H
#define KVCR_TEST_PROMTOOL_H

/* Passes when promtool accepts text without a remark; fails the test with
 * promtool's report otherwise. Skips the test, saying why, when promtool is
 * not installed. */
void assert_promtool_clean(const char *text);

#endif
