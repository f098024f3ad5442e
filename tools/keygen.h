/* `kvcr keygen`: a fresh CURVE key pair for the control channel. */
#ifndef KVCR_TOOLS_KEYGEN_H
#define KVCR_TOOLS_KEYGEN_H

#define KEYGEN_Z85 41 /* a Z85 key and its NUL */

/* A new key pair (Z85). 0, or -1 with the reason on stderr. */
int keygen_pair(char pub[KEYGEN_Z85], char sec[KEYGEN_Z85]);

int cmd_keygen(int argc, char **argv);

#endif
