/* `kvcr keygen` prints a fresh CURVE key pair, one key a line:
 *
 *   public-key <40 characters of Z85>
 *   secret-key <40 characters of Z85>
 *
 * The public key goes into every peer's allowed_keys (curve_allowed_keys
 * in Python); the secret key stays with this instance only
 * (kvcr_remote_options.curve.secret_key). Z85 uses characters a shell
 * treats specially: quote the keys when passing them around. */
#include "keygen.h"

#include <stdio.h>
#include <string.h>
#include <zmq.h>

int keygen_pair(char pub[KEYGEN_Z85], char sec[KEYGEN_Z85])
{
    if (!zmq_has("curve")) {
        fprintf(stderr, "kvcr keygen: this libzmq was built without CURVE (libsodium)\n");
        return -1;
    }
    if (zmq_curve_keypair(pub, sec) != 0) {
        fprintf(stderr, "kvcr keygen: zmq_curve_keypair failed: %s\n", zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

int cmd_keygen(int argc, char **argv)
{
    if (argc > 0 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
        printf("usage: kvcr keygen\n\nprints a new CURVE key pair (Z85): the public key for "
               "the peers' allow-lists, the secret key for this instance alone\n");
        return 0;
    }
    if (argc > 0) {
        fprintf(stderr, "kvcr keygen: unexpected argument '%s'\nusage: kvcr keygen\n", argv[0]);
        return 2;
    }
    char pub[KEYGEN_Z85], sec[KEYGEN_Z85];
    if (keygen_pair(pub, sec) != 0) return 1;
    printf("public-key %s\nsecret-key %s\n", pub, sec);
    return fflush(stdout) == 0 ? 0 : 1;
}
