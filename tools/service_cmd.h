/* `kvcr service` (the node daemon) and `kvcr stats --socket` (its metrics). */
#ifndef KVCR_TOOLS_SERVICE_CMD_H
#define KVCR_TOOLS_SERVICE_CMD_H

int cmd_service(int argc, char **argv);
int cmd_stats(int argc, char **argv);

#endif
