#include "net/json.h"

#include <stdlib.h>
#include <string.h>

typedef struct reader {
    const char *p, *end;
    json_doc *doc;
    int depth;
    bool oom; /* a failure was the allocator's, not the text's */
} reader;

static void skip_ws(reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static int grow(reader *r, void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need) ncap *= 2;
    void *b = realloc(*buf, ncap * elem);
    if (b == NULL) {
        r->oom = true;
        return -1;
    }
    *buf = b;
    *cap = ncap;
    return 0;
}

static uint32_t new_node(reader *r, uint8_t type)
{
    json_doc *d = r->doc;
    size_t cap = d->cap_nodes;
    if (d->n_nodes >= UINT32_MAX - 1 ||
        grow(r, (void **)&d->nodes, &cap, (size_t)d->n_nodes + 1, sizeof *d->nodes) != 0)
        return 0;
    d->cap_nodes = (uint32_t)cap;
    uint32_t i = d->n_nodes++;
    memset(&d->nodes[i], 0, sizeof d->nodes[i]);
    d->nodes[i].type = type;
    return i;
}

static int put_bytes(reader *r, const char *s, size_t n)
{
    json_doc *d = r->doc;
    if (grow(r, (void **)&d->strings, &d->cap_strings, d->n_strings + n + 1, 1) != 0) return -1;
    memcpy(d->strings + d->n_strings, s, n);
    d->n_strings += n;
    return 0;
}

static int put_utf8(reader *r, uint32_t cp)
{
    char b[4];
    size_t n;
    if (cp < 0x80) b[0] = (char)cp, n = 1;
    else if (cp < 0x800) b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
        b[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    else
        b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    return put_bytes(r, b, n);
}

static int hex4(reader *r, uint32_t *out)
{
    if (r->end - r->p < 4) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *r->p++;
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static int escape(reader *r)
{
    if (r->p >= r->end) return -1;
    char c = *r->p++;
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *hit = strchr(from, c);
    if (c != '\0' && hit != NULL) return put_bytes(r, &to[hit - from], 1);
    if (c != 'u') return -1;
    uint32_t cp, lo;
    if (hex4(r, &cp) != 0) return -1;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return -1; /* a lone low surrogate */
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u') return -1;
        r->p += 2;
        if (hex4(r, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF) return -1;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    return put_utf8(r, cp);
}

/* Copies one raw UTF-8 sequence, checking it is well formed. */
static int utf8_raw(reader *r)
{
    const unsigned char *s = (const unsigned char *)r->p;
    size_t left = (size_t)(r->end - r->p), n;
    uint32_t cp;
    if (s[0] < 0x80) n = 1, cp = s[0];
    else if ((s[0] & 0xE0) == 0xC0) n = 2, cp = s[0] & 0x1F;
    else if ((s[0] & 0xF0) == 0xE0) n = 3, cp = s[0] & 0x0F;
    else if ((s[0] & 0xF8) == 0xF0) n = 4, cp = s[0] & 0x07;
    else return -1;
    if (n > left) return -1;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    r->p += n;
    return put_bytes(r, (const char *)s, n);
}

/* A string token; its decoded bytes land in doc->strings. */
static int string_token(reader *r, uint32_t *off, uint32_t *len)
{
    if (r->p >= r->end || *r->p != '"') return -1;
    r->p++;
    size_t start = r->doc->n_strings;
    for (;;) {
        if (r->p >= r->end) return -1;
        unsigned char c = (unsigned char)*r->p;
        if (c == '"') break;
        if (c < 0x20) return -1;
        int rc = c == '\\' ? (r->p++, escape(r)) : utf8_raw(r);
        if (rc != 0) return -1;
    }
    r->p++;
    size_t n = r->doc->n_strings - start;
    if (put_bytes(r, "", 1) != 0 || n > UINT32_MAX || start > UINT32_MAX) return -1;
    *off = (uint32_t)start;
    *len = (uint32_t)n;
    return 0;
}

static int number(reader *r, json_node *n)
{
    bool neg = r->p < r->end && *r->p == '-';
    if (neg) r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return -1;
    if (*r->p == '0' && r->p + 1 < r->end && r->p[1] >= '0' && r->p[1] <= '9') return -1;
    uint64_t v = 0;
    bool fits = true;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        unsigned d = (unsigned)(*r->p++ - '0');
        if (v > (UINT64_MAX - d) / 10) fits = false;
        else v = v * 10 + d;
    }
    bool integral = true;
    if (r->p < r->end && *r->p == '.') {
        integral = false;
        r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return -1;
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        integral = false;
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return -1;
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    n->is_u64 = integral && fits && !neg; /* "-0" is not an unsigned integer either */
    n->u64 = v;
    return 0;
}

static int literal(reader *r, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return -1;
    r->p += n;
    return 0;
}

static uint32_t value(reader *r);

static bool key_taken(const json_doc *d, uint32_t first, uint32_t off, uint32_t len)
{
    for (uint32_t c = first; c; c = d->nodes[c].next)
        if (d->nodes[c].key_len == len &&
            memcmp(d->strings + d->nodes[c].key_off, d->strings + off, len) == 0)
            return true;
    return false;
}

/* Parses the members or elements of a container opened at r->p. */
static int container(reader *r, uint32_t self, bool object)
{
    char close = object ? '}' : ']';
    r->p++;
    skip_ws(r);
    uint32_t last = 0;
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    for (;;) {
        uint32_t key_off = 0, key_len = 0;
        if (object) {
            skip_ws(r);
            if (string_token(r, &key_off, &key_len) != 0) return -1;
            skip_ws(r);
            if (r->p >= r->end || *r->p++ != ':') return -1;
            if (key_taken(r->doc, r->doc->nodes[self].first_child, key_off, key_len)) return -1;
        }
        uint32_t child = value(r);
        if (child == 0) return -1;
        json_node *c = &r->doc->nodes[child];
        c->key_off = key_off;
        c->key_len = key_len;
        if (last)
            r->doc->nodes[last].next = child;
        else
            r->doc->nodes[self].first_child = child;
        last = child;
        r->doc->nodes[self].n_children++;
        skip_ws(r);
        if (r->p >= r->end) return -1;
        char c2 = *r->p++;
        if (c2 == close) return 0;
        if (c2 != ',') return -1;
    }
}

/* One value; returns its node index, 0 on error. */
static uint32_t value(reader *r)
{
    skip_ws(r);
    if (r->p >= r->end) return 0;
    char c = *r->p;
    uint32_t i;
    if (c == '{' || c == '[') {
        if (++r->depth > JSON_MAX_DEPTH) return 0;
        if ((i = new_node(r, c == '{' ? JSON_OBJECT : JSON_ARRAY)) == 0) return 0;
        if (container(r, i, c == '{') != 0) return 0;
        r->depth--;
        return i;
    }
    if (c == '"') {
        uint32_t off, len;
        if ((i = new_node(r, JSON_STRING)) == 0 || string_token(r, &off, &len) != 0) return 0;
        r->doc->nodes[i].str_off = off;
        r->doc->nodes[i].str_len = len;
        return i;
    }
    if (c == 't') return literal(r, "true") == 0 ? new_node(r, JSON_TRUE) : 0;
    if (c == 'f') return literal(r, "false") == 0 ? new_node(r, JSON_FALSE) : 0;
    if (c == 'n') return literal(r, "null") == 0 ? new_node(r, JSON_NULL) : 0;
    if ((i = new_node(r, JSON_NUMBER)) == 0) return 0;
    return number(r, &r->doc->nodes[i]) == 0 ? i : 0;
}

int json_parse(const char *text, size_t len, json_doc *doc)
{
    memset(doc, 0, sizeof *doc);
    if (text == NULL || len > JSON_MAX_TEXT) return -1;
    reader r = {text, text + len, doc, 0, false};
    /* Node 0 is a placeholder so that index 0 can mean "none". */
    size_t cap = 0;
    bool ok = grow(&r, (void **)&doc->nodes, &cap, 64, sizeof *doc->nodes) == 0;
    if (ok) {
        doc->cap_nodes = (uint32_t)cap;
        memset(&doc->nodes[0], 0, sizeof doc->nodes[0]);
        doc->n_nodes = 1;
        ok = value(&r) == 1;
    }
    skip_ws(&r);
    if (!ok || r.p != r.end || put_bytes(&r, "", 1) != 0) {
        json_free(doc);
        return r.oom ? JSON_ENOMEM : -1;
    }
    return 0;
}

void json_free(json_doc *doc)
{
    free(doc->nodes);
    free(doc->strings);
    memset(doc, 0, sizeof *doc);
}

const json_node *json_get(const json_doc *d, const json_node *obj, const char *key)
{
    if (obj == NULL || obj->type != JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (uint32_t c = obj->first_child; c; c = d->nodes[c].next)
        if (d->nodes[c].key_len == n && memcmp(d->strings + d->nodes[c].key_off, key, n) == 0)
            return &d->nodes[c];
    return NULL;
}
