/* The tests' KV-event replay client (kvreplay.h). */
#include "kvreplay.h"

#include <zmq.h>

/* One answer's three frames into f[]; how many came (3 for a whole one). */
static int recv_answer(void *d, zmq_msg_t f[3])
{
    int n = 0;
    for (bool more = true; more && n < 3; n++) {
        zmq_msg_init(&f[n]);
        if (zmq_msg_recv(&f[n], d, 0) < 0) {
            zmq_msg_close(&f[n]);
            return n;
        }
        more = zmq_msg_more(&f[n]);
    }
    return n == 3 && !zmq_msg_more(&f[2]) ? 3 : n;
}

bool kv_replay_each(const char *endpoint, uint64_t start, int timeout_ms, kv_replay_fn each,
                    void *ud)
{
    void *ctx = zmq_ctx_new(), *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    uint8_t be[8];
    for (int i = 7; i >= 0; i--, start >>= 8) be[i] = (uint8_t)start;
    bool ended = false, broken = false;
    if (zmq_connect(d, endpoint) == 0 && zmq_send(d, "", 0, ZMQ_SNDMORE) == 0 &&
        zmq_send(d, be, 8, 0) == 8) {
        for (uint32_t i = 0; i < (1u << 20) && !ended && !broken; i++) {
            zmq_msg_t f[3];
            int n = recv_answer(d, f);
            broken = n != 3 || zmq_msg_size(&f[0]) != 0 || zmq_msg_size(&f[1]) != 8;
            if (!broken) {
                const uint8_t *s = zmq_msg_data(&f[1]);
                uint64_t seq = 0;
                for (int k = 0; k < 8; k++) seq = seq << 8 | s[k];
                ended = seq == UINT64_MAX;
                broken = ended && zmq_msg_size(&f[2]) != 0;
                if (!ended) each(ud, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
            }
            for (int k = 0; k < n; k++) zmq_msg_close(&f[k]);
        }
    }
    zmq_close(d);
    zmq_ctx_term(ctx);
    return ended && !broken;
}
