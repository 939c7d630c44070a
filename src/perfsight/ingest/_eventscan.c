/* Columnar scanner for the event array of a Chrome-trace JSON document.
 *
 * One pass over a buffer that starts between two events of the array: every event is
 * validated as strict JSON (strings, escapes, UTF-8, numbers, nesting), the values of the
 * few keys the caller asked for are located, and, once the event is known to be whole and
 * valid, converted into caller-owned column buffers.  Nothing is allocated here and no
 * Python API is used: the library is loaded with ctypes and runs without the GIL.
 *
 * The caller (perfsight/ingest/fastscan.py) owns the policy:
 *   - an event whose kept values do not fit a column's type (a string pid is the one
 *     exception the columns foresee) becomes a "slow row": its span is reported and the
 *     caller decodes it with a general JSON library;
 *   - anything that is not a well-formed event stops the scan (status SCAN_INVALID) at the
 *     start of that event, and the caller hands the rest of the stream to its general path,
 *     which decides what is damage;
 *   - an event cut by the end of the buffer is left for the next call (SCAN_NEED_MORE).
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* SSE2 (every x86-64 CPU has it) runs the two loops that see every byte -- plain string bytes
 * and whitespace -- 16 bytes at a time; elsewhere, or built with -DES_NO_SIMD (the tests build
 * both), the same loops go byte by byte, with the same results. */
#if defined(__SSE2__) && !defined(ES_NO_SIMD) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
#define ES_SIMD 1
#endif

/* For the small helpers every byte goes through: gcc left skip_ws out of line once it held a
 * SIMD loop, and the call cost more than the loop. */
#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

#ifndef ES_SOURCE_HASH
#define ES_SOURCE_HASH "unknown"
#endif

/* The hash of this file the library was built from: the loader refuses a stale build. */
const char *es_source_hash(void) { return ES_SOURCE_HASH; }

enum { SCAN_NEED_MORE = 0, SCAN_END = 1, SCAN_FULL = 2, SCAN_INVALID = 3 };
enum { K_STR = 1, K_INT = 2, K_TIME = 3, K_FLOAT = 4, K_INT_LIST = 5, K_INT_LIST_LIST = 6, K_STR_LIST = 7, K_ID = 8 };
enum { T_NONE = 0, T_STR = 1, T_NUM = 2, T_ARR = 3, T_OBJ = 4, T_TRUE = 5, T_FALSE = 6, T_NULL = 7 };

#define MAX_DEPTH 512
#define MAX_COLUMNS 64
#define HASH_SIZE 256 /* key words, open addressing: more than 4x the keys a spec may name */
#define NEED_MORE (-2)
#define INVALID (-1)

typedef struct {
    int32_t kind;
    int32_t label;  /* K_ID: index of the K_STR column that takes string values, else -1 */
    uint8_t *valid; /* [rows_cap] */
    int64_t *ints;  /* K_INT, K_TIME, K_ID: [rows_cap] */
    double *floats; /* K_FLOAT: [rows_cap] */
    int32_t *offsets; /* K_STR and list kinds: [rows_cap + 1] */
    int32_t *inner;   /* K_INT_LIST_LIST, K_STR_LIST: [inner_cap + 1] */
    int64_t *values;  /* list kinds of ints: [values_cap] */
    uint8_t *heap;    /* K_STR, K_STR_LIST: [heap_cap] */
    int64_t heap_cap, inner_cap, values_cap;
    int64_t heap_len, inner_len, values_len;
    int64_t present; /* rows with a value; a column no row mentions is left untouched */
} column_t;

typedef struct {
    /* scope 0: keys of the event object; scope 1: keys of its "args" object */
    int32_t nkeys;
    const uint8_t *const *keys;
    const int32_t *key_lens;
    const int32_t *key_scopes;
    const int32_t *key_columns;
    int32_t ncolumns;
    column_t *columns;
    int32_t ph_column;        /* the column holding "ph": filters events */
    const uint8_t *keep_ph;   /* [256]: 1 for the one-letter phases to keep */
    int64_t rows_cap;
    int64_t *slow_rows, *slow_start, *slow_end; /* [rows_cap] */
} spec_t;

typedef struct {
    int64_t pos;    /* where the next call starts (or the ']' for SCAN_END, the bad event) */
    int64_t rows;   /* in: rows already in the columns (a call that goes on after SCAN_NEED_MORE
                     * with the next block); out: rows in the columns */
    int64_t events; /* whole events consumed (kept or not) */
    int64_t slow;   /* slow rows */
    int32_t status;
    int32_t full_column; /* SCAN_FULL: the column out of room, -1 for rows */
    int64_t lone_surrogates; /* \uD800-\uDFFF escapes without their pair, in whole events */
} result_t;

typedef struct {
    int64_t start, end; /* value span */
    int32_t type;
    int32_t escaped;
    uint32_t gen;
} slot_t;

/* A key as two words: its first 16 bytes, zero-padded (see key_words), with its length and the
 * column it feeds (-1: none, -2: the event's own "args").  A key of the spec is found by these
 * words in a hash table, and the key at each place of the last object of a scope is remembered:
 * the events of a trace name their keys in the same order, so comparing two words with the key
 * met at the same place last time most often settles it. */
typedef struct {
    uint64_t head, tail;
    int32_t len; /* 0: an empty entry */
    int32_t slot;
} key_words_t;

#define SEEN_KEYS 32 /* places remembered per scope; later keys of a long object are looked up */

typedef struct {
    const uint8_t *b;
    int64_t n;
    const spec_t *spec;
    slot_t slots[MAX_COLUMNS];
    int64_t filled[MAX_COLUMNS]; /* rows [0, filled) of each column are written */
    uint64_t labels; /* bit i: column i holds the text of an id column (K_ID's label) */
    uint64_t sized;  /* bit i: a value of column i needs room (has_room), in it or in its label */
    uint32_t gen;
    uint64_t touched; /* bit i: slot i holds a value of the current event (MAX_COLUMNS <= 64) */
    int32_t bad_key; /* an escaped key: its meaning needs a general decoder */
    int64_t lone;    /* lone surrogate escapes seen in the current event */
    key_words_t seen[2][SEEN_KEYS]; /* per scope and place in the object: the key met there last */
    key_words_t words[2][HASH_SIZE]; /* per scope: the spec's keys (and "args") by word_hash */
    const uint8_t *long_keys[2][HASH_SIZE]; /* the spec's text of each key longer than 16 bytes */
} scan_t;

/* ---------- validation ---------- */

static uint8_t str_class[256]; /* 0 plain, 1 quote, 2 backslash, 3 control, 4 non-ASCII */
static int tables_ready = 0;

static void init_tables(void) {
    if (tables_ready) return;
    for (int c = 0; c < 256; c++) str_class[c] = c < 0x20 ? 3 : c >= 0x80 ? 4 : 0;
    str_class['"'] = 1;
    str_class['\\'] = 2;
    tables_ready = 1;
}

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* The first byte at or after p that is not whitespace, or n.  Most calls meet no whitespace or a
 * single space (after ':' and ','); an indented document's line breaks are runs of several. */
static ALWAYS_INLINE int64_t skip_ws(const uint8_t *b, int64_t p, int64_t n) {
    if (p >= n || !is_ws(b[p])) return p;
    if (++p >= n || !is_ws(b[p])) return p;
#ifdef ES_SIMD
    while (p + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + p));
        __m128i ws = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(' ')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\n'))),
                                  _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\r')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\t'))));
        int other = ~_mm_movemask_epi8(ws) & 0xFFFF;
        if (other) return p + __builtin_ctz((unsigned)other);
        p += 16;
    }
#endif
    while (p < n && is_ws(b[p])) p++;
    return p;
}

/* The first byte at or after p that ends a run of plain string bytes -- a quote, a backslash, a
 * control or a non-ASCII byte (str_class != 0) -- or n. */
static ALWAYS_INLINE int64_t plain_run(const uint8_t *b, int64_t p, int64_t n) {
#ifdef ES_SIMD
    while (p + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(b + p));
        /* signed bytes: a control byte (0x00-0x1F) and a non-ASCII one (0x80-0xFF) are < 0x20 */
        __m128i special = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                                       _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
        int mask = _mm_movemask_epi8(special);
        if (mask) return p + __builtin_ctz((unsigned)mask);
        p += 16;
    }
#endif
    while (p < n && str_class[b[p]] == 0) p++;
    return p;
}

static inline int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Length of a valid UTF-8 sequence starting at b[p], 0 if invalid, -1 if cut by n. */
static int utf8_len(const uint8_t *b, int64_t p, int64_t n) {
    uint8_t c = b[p];
    int len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    for (int i = 1; i < len; i++) {
        if (p + i >= n) return -1;
        uint8_t d = b[p + i];
        if (i == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return 0;
    }
    return len;
}

static inline int64_t hex4(const uint8_t *b, int64_t p) {
    int a = hexval(b[p]), c = hexval(b[p + 1]), d = hexval(b[p + 2]), e = hexval(b[p + 3]);
    return (a | c | d | e) < 0 ? -1 : (int64_t)(a << 12 | c << 8 | d << 4 | e);
}

/* scan_string from b[p] on, a byte of the string that is not plain (str_class != 0) or n. */
static int64_t scan_string_rest(const uint8_t *b, int64_t p, int64_t n, int32_t *escaped, int64_t *lone) {
    for (;;) {
        p = plain_run(b, p, n);
        if (p >= n) return NEED_MORE;
        switch (str_class[b[p]]) {
        case 1:
            return p + 1;
        case 2:
            *escaped = 1;
            if (p + 1 >= n) return NEED_MORE;
            switch (b[p + 1]) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                p += 2;
                break;
            case 'u': {
                if (p + 6 > n) return NEED_MORE;
                int64_t cp = hex4(b, p + 2);
                if (cp < 0) return INVALID;
                p += 6;
                if (cp >= 0xDC00 && cp <= 0xDFFF) (*lone)++;
                else if (cp >= 0xD800 && cp <= 0xDBFF) {
                    /* paired when a low surrogate escape follows at once */
                    if (p + 2 > n) return NEED_MORE;
                    if (b[p] == '\\' && b[p + 1] == 'u') {
                        if (p + 6 > n) return NEED_MORE;
                        int64_t low = hex4(b, p + 2);
                        if (low < 0) return INVALID;
                        if (low >= 0xDC00 && low <= 0xDFFF) p += 6;
                        else (*lone)++;
                    } else (*lone)++;
                }
                break;
            }
            default:
                return INVALID;
            }
            break;
        case 3:
            return INVALID;
        default: {
            int len = utf8_len(b, p, n);
            if (len < 0) return NEED_MORE;
            if (len == 0) return INVALID;
            p += len;
        }
        }
    }
}

/* b[p] == '"'; returns the offset after the closing quote.  Counts in *lone the \u escapes of
 * surrogates that are not a high-low pair (valid JSON; decoded as U+FFFD by the caller).
 * Inline for the common string, plain bytes up to its quote; the rest out of line. */
static inline int64_t scan_string(const uint8_t *b, int64_t p, int64_t n, int32_t *escaped, int64_t *lone) {
    p = plain_run(b, p + 1, n);
    if (p < n && b[p] == '"') return p + 1;
    return scan_string_rest(b, p, n, escaped, lone);
}

static int64_t scan_number(const uint8_t *b, int64_t p, int64_t n) {
    if (b[p] == '-') p++;
    if (p >= n) return NEED_MORE;
    if (b[p] == '0') p++;
    else if (b[p] >= '1' && b[p] <= '9') {
        while (p < n && b[p] >= '0' && b[p] <= '9') p++;
    } else return INVALID;
    if (p < n && b[p] == '.') {
        p++;
        if (p >= n) return NEED_MORE;
        if (b[p] < '0' || b[p] > '9') return INVALID;
        while (p < n && b[p] >= '0' && b[p] <= '9') p++;
    }
    if (p < n && (b[p] == 'e' || b[p] == 'E')) {
        p++;
        if (p < n && (b[p] == '+' || b[p] == '-')) p++;
        if (p >= n) return NEED_MORE;
        if (b[p] < '0' || b[p] > '9') return INVALID;
        while (p < n && b[p] >= '0' && b[p] <= '9') p++;
    }
    /* a number cut by the buffer may go on in the next block */
    if (p >= n) return NEED_MORE;
    return p;
}

static int64_t scan_literal(const uint8_t *b, int64_t p, int64_t n, const char *word, int64_t len) {
    for (int64_t i = 0; i < len; i++) {
        if (p + i >= n) return NEED_MORE;
        if (b[p + i] != (uint8_t)word[i]) return INVALID;
    }
    return p + len;
}

static int64_t scan_value(scan_t *s, int64_t p, int depth, int32_t *type, int32_t *escaped);

/* a[0..len) == b[0..len), eight bytes at a time: keys are short, and libc's memcmp, called once
 * per key of every event, cost 3 % of reading a trace in its call alone. */
static inline int same_bytes(const uint8_t *a, const uint8_t *b, int64_t len) {
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y) return 0;
    }
    for (; i < len; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static inline uint64_t load_word(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* The first `len` (0-8) bytes of a word as loaded from memory, the others zero. */
static inline uint64_t first_bytes(uint64_t w, int64_t len) {
    if (len >= 8) return w;
    if (len <= 0) return 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return w & ~(~(uint64_t)0 >> (8 * len));
#else
    return w & (((uint64_t)1 << (8 * len)) - 1);
#endif
}

/* The key at k[0..len) as two words: its first 16 bytes, zero-padded; `room` bytes are readable
 * from k (fewer than 16: the key is copied first). */
static inline void key_words(const uint8_t *k, int64_t len, int64_t room, uint64_t *head, uint64_t *tail) {
    uint8_t padded[16] = {0};
    if (room < 16) {
        memcpy(padded, k, (size_t)(len < 16 ? len : 16));
        k = padded;
    }
    *head = first_bytes(load_word(k), len);
    *tail = first_bytes(load_word(k + 8), len - 8);
}

static inline uint32_t word_hash(uint64_t head, int64_t len) {
    return (uint32_t)(((head ^ (uint64_t)len) * 0x9E3779B97F4A7C15ull) >> 56) & (HASH_SIZE - 1);
}

/* Enter the key k[0..len) of `scope` (feeding `slot`) into s->words; 0 when the table is full. */
static int add_key_words(scan_t *s, int scope, const uint8_t *k, int64_t len, int32_t slot) {
    uint64_t head, tail;
    key_words(k, len, 0, &head, &tail);
    uint32_t h = word_hash(head, len);
    for (int probes = 0; s->words[scope][h].len; probes++, h = (h + 1) & (HASH_SIZE - 1)) {
        if (probes == HASH_SIZE) return 0;
        key_words_t *e = &s->words[scope][h];
        if (e->len == len && e->head == head && e->tail == tail &&
            (len <= 16 || same_bytes(s->long_keys[scope][h] + 16, k + 16, len - 16)))
            return 1; /* named twice: the first wins */
    }
    s->words[scope][h] = (key_words_t){head, tail, (int32_t)len, slot};
    s->long_keys[scope][h] = k;
    return 1;
}

/* The column the key at key[0..len) (as key_words) of this scope feeds: -1 for keys nobody asked
 * for, -2 for the event's own "args". */
static inline int find_key_words(const scan_t *s, int scope, const uint8_t *key, int64_t len, uint64_t head,
                                 uint64_t tail) {
    for (uint32_t h = word_hash(head, len);; h = (h + 1) & (HASH_SIZE - 1)) {
        const key_words_t *e = &s->words[scope][h];
        if (!e->len) return -1;
        if (e->len == len && e->head == head && e->tail == tail &&
            (len <= 16 || same_bytes(s->long_keys[scope][h] + 16, key + 16, len - 16)))
            return e->slot;
    }
}

/* The column the key at key[0..len) of this scope feeds (-1: none, -2: "args"); `room` bytes are
 * readable from key on.  `at`: the key's place in its object. */
static inline int lookup_key(scan_t *s, int scope, int at, const uint8_t *key, int64_t len, int64_t room) {
    if (len == 0) return -1; /* no column is named by an empty key (build_keys) */
    uint64_t head, tail;
    key_words(key, len, room, &head, &tail);
    key_words_t *seen = at < SEEN_KEYS ? &s->seen[scope][at] : NULL;
    if (seen && seen->len == len && seen->head == head && seen->tail == tail && len <= 16) return seen->slot;
    int slot = find_key_words(s, scope, key, len, head, tail);
    if (seen) *seen = (key_words_t){head, tail, (int32_t)len, slot};
    return slot;
}

/* The spec's keys by scope, as words (a key named twice: its first column), then the event's
 * "args" where the spec does not name it itself; 0 for a spec that cannot be scanned. */
static int build_keys(scan_t *s) {
    const spec_t *sp = s->spec;
    if (sp->nkeys > HASH_SIZE / 4) return 0;
    for (int32_t k = 0; k < sp->nkeys; k++) {
        int scope = sp->key_scopes[k];
        if (scope < 0 || scope > 1 || sp->key_columns[k] < 0 || sp->key_columns[k] >= sp->ncolumns ||
            sp->key_lens[k] <= 0)
            return 0;
        if (!add_key_words(s, scope, sp->keys[k], sp->key_lens[k], sp->key_columns[k])) return 0;
    }
    return add_key_words(s, 0, (const uint8_t *)"args", 4, -2);
}

static int64_t scan_container(scan_t *s, int64_t p, int depth, int is_object, int scope) {
    const uint8_t *b = s->b;
    int64_t n = s->n;
    uint8_t close = is_object ? '}' : ']';
    if (depth > MAX_DEPTH) return INVALID;
    p = skip_ws(b, p + 1, n);
    if (p >= n) return NEED_MORE;
    if (b[p] == close) return p + 1;
    for (int at = 0;; at++) {
        int slot = -1;
        if (is_object) {
            if (b[p] != '"') return INVALID;
            int32_t key_escaped = 0;
            int64_t key_end = scan_string(b, p, n, &key_escaped, &s->lone);
            if (key_end < 0) return key_end;
            if (scope >= 0) {
                if (key_escaped) s->bad_key = 1;
                slot = lookup_key(s, scope, at, b + p + 1, key_end - p - 2, n - p - 1);
            }
            p = skip_ws(b, key_end, n);
            if (p >= n) return NEED_MORE;
            if (b[p] != ':') return INVALID;
            p = skip_ws(b, p + 1, n);
            if (p >= n) return NEED_MORE;
        }
        int64_t start = p;
        int32_t type = T_NONE, escaped = 0;
        if (slot == -2 && b[p] == '{') {
            p = scan_container(s, p, depth + 1, 1, 1);
            type = T_OBJ;
        } else {
            p = scan_value(s, p, depth + 1, &type, &escaped);
        }
        if (p < 0) return p;
        if (slot >= 0) {
            slot_t *sl = &s->slots[slot];
            sl->start = start;
            sl->end = p;
            sl->type = type;
            sl->escaped = escaped;
            sl->gen = s->gen;
            s->touched |= (uint64_t)1 << slot;
        } else if (slot == -2 && type != T_OBJ && type != T_NULL) {
            s->bad_key = 1; /* "args" that is not an object: let the general decoder judge */
        }
        p = skip_ws(b, p, n);
        if (p >= n) return NEED_MORE;
        if (b[p] == close) return p + 1;
        if (b[p] != ',') return INVALID;
        p = skip_ws(b, p + 1, n);
        if (p >= n) return NEED_MORE;
    }
}

static int64_t scan_value(scan_t *s, int64_t p, int depth, int32_t *type, int32_t *escaped) {
    const uint8_t *b = s->b;
    int64_t n = s->n;
    switch (b[p]) {
    case '"':
        *type = T_STR;
        return scan_string(b, p, n, escaped, &s->lone);
    case '{':
        *type = T_OBJ;
        return scan_container(s, p, depth, 1, -1);
    case '[':
        *type = T_ARR;
        return scan_container(s, p, depth, 0, -1);
    case 't':
        *type = T_TRUE;
        return scan_literal(b, p, n, "true", 4);
    case 'f':
        *type = T_FALSE;
        return scan_literal(b, p, n, "false", 5);
    case 'n':
        *type = T_NULL;
        return scan_literal(b, p, n, "null", 4);
    default:
        if (b[p] == '-' || (b[p] >= '0' && b[p] <= '9')) {
            *type = T_NUM;
            return scan_number(b, p, n);
        }
        return INVALID;
    }
}

/* ---------- conversion of located values (already validated) ---------- */

/* Strict integer "-?[0-9]+" in [start, end) -> *out; 0 if not an int64 (or INT64_MIN). */
static int parse_int(const uint8_t *b, int64_t p, int64_t end, int64_t *out) {
    int neg = 0;
    if (p < end && b[p] == '-') {
        neg = 1;
        p++;
    }
    if (p >= end) return 0;
    uint64_t v = 0;
    for (; p < end; p++) {
        uint8_t c = b[p];
        if (c < '0' || c > '9') return 0;
        if (v > (uint64_t)INT64_MAX / 10) return 0;
        v = v * 10 + (uint64_t)(c - '0');
        if (v > (uint64_t)INT64_MAX) return 0;
    }
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* Decimal microseconds "-?[0-9]+(.[0-9]+)?" -> nanoseconds, rounded half to even past
 * three decimals; 0 when the text is anything else or out of range. */
static int parse_micros(const uint8_t *b, int64_t p, int64_t end, int64_t *out) {
    int neg = 0;
    if (p < end && b[p] == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || b[p] < '0' || b[p] > '9') return 0;
    uint64_t v = 0;
    for (; p < end && b[p] >= '0' && b[p] <= '9'; p++) {
        if (v > (uint64_t)INT64_MAX / 10) return 0;
        v = v * 10 + (uint64_t)(b[p] - '0');
    }
    int digits = 0, round_digit = -1, sticky = 0;
    if (p < end && b[p] == '.') {
        p++;
        if (p >= end) return 0;
        for (; p < end && b[p] >= '0' && b[p] <= '9'; p++) {
            int d = b[p] - '0';
            if (digits < 3) {
                if (v > (uint64_t)INT64_MAX / 10) return 0;
                v = v * 10 + (uint64_t)d;
                digits++;
            } else if (round_digit < 0) {
                round_digit = d;
            } else if (d) {
                sticky = 1;
            }
        }
    }
    if (p != end) return 0;
    for (; digits < 3; digits++) {
        if (v > (uint64_t)INT64_MAX / 10) return 0;
        v *= 10;
    }
    if (round_digit > 5 || (round_digit == 5 && (sticky || (v & 1)))) v++;
    if (v > (uint64_t)INT64_MAX) return 0;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* A JSON number as a double.  Short decimals take the exact fast path (an integer mantissa
 * below 2^53 divided by a power of ten is correctly rounded) and need no locale; the rest
 * go through strtod. */
static int parse_double(const uint8_t *b, int64_t p, int64_t end, double *out) {
    static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    int neg = 0, digits = 0, frac = -1;
    uint64_t m = 0;
    int64_t q = p;
    if (b[q] == '-') {
        neg = 1;
        q++;
    }
    for (; q < end; q++) {
        if (b[q] == '.') frac = 0;
        else if (b[q] >= '0' && b[q] <= '9') {
            m = m * 10 + (uint64_t)(b[q] - '0');
            if (m || digits) digits++;
            if (frac >= 0) frac++;
        } else break;
        if (digits > 15) break;
    }
    if (q == end && digits <= 15 && frac <= 22) {
        double v = (double)m / pow10[frac < 0 ? 0 : frac];
        *out = neg ? -v : v;
        return 1;
    }
    char text[64];
    if (end - p > 63) return 0;
    memcpy(text, b + p, (size_t)(end - p));
    text[end - p] = 0;
    *out = strtod(text, NULL);
    return 1;
}

/* Decode the JSON string at [start, end) (quotes included) into dst; returns bytes written,
 * or -1 for a lone surrogate (the general decoder decides what that means). */
static int64_t decode_string(const uint8_t *b, int64_t start, int64_t end, int32_t escaped, uint8_t *dst) {
    int64_t p = start + 1, stop = end - 1;
    if (!escaped) {
        memcpy(dst, b + p, (size_t)(stop - p));
        return stop - p;
    }
    int64_t w = 0;
    while (p < stop) {
        uint8_t c = b[p];
        if (c != '\\') {
            dst[w++] = c;
            p++;
            continue;
        }
        uint8_t e = b[p + 1];
        p += 2;
        switch (e) {
        case 'b': dst[w++] = '\b'; break;
        case 'f': dst[w++] = '\f'; break;
        case 'n': dst[w++] = '\n'; break;
        case 'r': dst[w++] = '\r'; break;
        case 't': dst[w++] = '\t'; break;
        case 'u': {
            uint32_t cp = (uint32_t)(hexval(b[p]) << 12 | hexval(b[p + 1]) << 8 | hexval(b[p + 2]) << 4 |
                                     hexval(b[p + 3]));
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p + 6 > stop || b[p] != '\\' || b[p + 1] != 'u') return -1;
                uint32_t lo = (uint32_t)(hexval(b[p + 2]) << 12 | hexval(b[p + 3]) << 8 |
                                         hexval(b[p + 4]) << 4 | hexval(b[p + 5]));
                if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return -1;
            }
            if (cp < 0x80) dst[w++] = (uint8_t)cp;
            else if (cp < 0x800) {
                dst[w++] = (uint8_t)(0xC0 | cp >> 6);
                dst[w++] = (uint8_t)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                dst[w++] = (uint8_t)(0xE0 | cp >> 12);
                dst[w++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                dst[w++] = (uint8_t)(0x80 | (cp & 0x3F));
            } else {
                dst[w++] = (uint8_t)(0xF0 | cp >> 18);
                dst[w++] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
                dst[w++] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
                dst[w++] = (uint8_t)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: dst[w++] = e; /* '"', '\\', '/' */
        }
    }
    return w;
}

/* Next element of an array already validated: *p is after '[' or after an element.
 * Returns 1 with [*start, *end) set, 0 at the closing bracket. */
static int next_element(const uint8_t *b, int64_t *p, int64_t *start, int64_t *end, int32_t *escaped) {
    int64_t q = *p;
    while (is_ws(b[q]) || b[q] == ',') q++;
    if (b[q] == ']') {
        *p = q + 1;
        return 0;
    }
    *start = q;
    *escaped = 0;
    if (b[q] == '"') {
        q++;
        while (b[q] != '"') {
            if (b[q] == '\\') {
                *escaped = 1;
                q++;
            }
            q++;
        }
        q++;
    } else if (b[q] == '[' || b[q] == '{') {
        int depth = 0;
        do {
            if (b[q] == '"') {
                q++;
                while (b[q] != '"') q += b[q] == '\\' ? 2 : 1;
            } else if (b[q] == '[' || b[q] == '{') depth++;
            else if (b[q] == ']' || b[q] == '}') depth--;
            q++;
        } while (depth);
    } else {
        while (!is_ws(b[q]) && b[q] != ',' && b[q] != ']') q++;
    }
    *end = q;
    *p = q;
    return 1;
}

/* Append the ints of the array at [start, ...) to values; 0 on anything but int64s. */
static int append_ints(const uint8_t *b, int64_t start, column_t *c) {
    int64_t p = start + 1, s, e;
    int32_t esc;
    while (next_element(b, &p, &s, &e, &esc)) {
        int64_t v;
        if (!parse_int(b, s, e, &v)) return 0;
        c->values[c->values_len++] = v;
    }
    return 1;
}

/* Room check before converting: a value never needs more than its raw span. */
static int has_room(const column_t *c, const slot_t *sl) {
    int64_t span = sl->end - sl->start;
    switch (c->kind) {
    case K_STR:
        return c->heap_len + span <= c->heap_cap;
    case K_INT_LIST:
        return c->values_len + span / 2 + 1 <= c->values_cap;
    case K_INT_LIST_LIST:
        return c->values_len + span / 2 + 1 <= c->values_cap && c->inner_len + span / 2 + 1 <= c->inner_cap;
    case K_STR_LIST:
        return c->heap_len + span <= c->heap_cap && c->inner_len + span / 2 + 1 <= c->inner_cap;
    default:
        return 1;
    }
}

/* Convert one located value into row `row` of column c; 0 when its type does not fit. */
static int convert(const uint8_t *b, const spec_t *sp, column_t *c, const slot_t *sl, int64_t row) {
    switch (c->kind) {
    case K_STR: {
        if (sl->type != T_STR) return 0;
        int64_t w = decode_string(b, sl->start, sl->end, sl->escaped, c->heap + c->heap_len);
        if (w < 0) return 0;
        c->heap_len += w;
        return 1;
    }
    case K_ID:
        if (sl->type == T_STR && c->label >= 0) {
            column_t *label = &sp->columns[c->label];
            int64_t w = decode_string(b, sl->start, sl->end, sl->escaped, label->heap + label->heap_len);
            if (w < 0) return 0;
            label->heap_len += w;
            return 2; /* the id itself stays null; its label column holds the text */
        }
        /* fall through */
    case K_INT:
        return sl->type == T_NUM && parse_int(b, sl->start, sl->end, &c->ints[row]);
    case K_TIME:
        if (sl->type == T_NUM) return parse_micros(b, sl->start, sl->end, &c->ints[row]);
        if (sl->type == T_STR && !sl->escaped) {
            int64_t s = sl->start + 1, e = sl->end - 1;
            while (s < e && is_ws(b[s])) s++;
            while (e > s && is_ws(b[e - 1])) e--;
            return parse_micros(b, s, e, &c->ints[row]);
        }
        return 0;
    case K_FLOAT:
        return sl->type == T_NUM && parse_double(b, sl->start, sl->end, &c->floats[row]);
    case K_INT_LIST: {
        if (sl->type != T_ARR) return 0;
        int64_t saved = c->values_len;
        if (!append_ints(b, sl->start, c)) {
            c->values_len = saved;
            return 0;
        }
        return 1;
    }
    case K_INT_LIST_LIST: {
        if (sl->type != T_ARR) return 0;
        int64_t saved_values = c->values_len, saved_inner = c->inner_len;
        int64_t p = sl->start + 1, s, e;
        int32_t esc;
        while (next_element(b, &p, &s, &e, &esc)) {
            if (b[s] != '[' || !append_ints(b, s, c)) {
                c->values_len = saved_values;
                c->inner_len = saved_inner;
                return 0;
            }
            c->inner[++c->inner_len] = (int32_t)c->values_len;
        }
        return 1;
    }
    case K_STR_LIST: {
        if (sl->type != T_ARR) return 0;
        int64_t saved_heap = c->heap_len, saved_inner = c->inner_len;
        int64_t p = sl->start + 1, s, e;
        int32_t esc;
        while (next_element(b, &p, &s, &e, &esc)) {
            int64_t w = b[s] == '"' ? decode_string(b, s, e, esc, c->heap + c->heap_len) : -1;
            if (w < 0) {
                c->heap_len = saved_heap;
                c->inner_len = saved_inner;
                return 0;
            }
            c->heap_len += w;
            c->inner[++c->inner_len] = (int32_t)c->heap_len;
        }
        return 1;
    }
    }
    return 0;
}

/* Mark rows [c->filled, upto) of column c as null (a column only sees rows with its key). */
static void fill_gap(scan_t *s, int32_t i, int64_t upto) {
    column_t *c = &s->spec->columns[i];
    int64_t from = s->filled[i];
    memset(c->valid + from, 0, (size_t)(upto - from));
    int32_t *offsets = NULL, end = 0;
    switch (c->kind) {
    case K_STR: offsets = c->offsets; end = (int32_t)c->heap_len; break;
    case K_INT_LIST: offsets = c->offsets; end = (int32_t)c->values_len; break;
    case K_INT_LIST_LIST:
    case K_STR_LIST: offsets = c->offsets; end = (int32_t)c->inner_len; break;
    case K_FLOAT: memset(c->floats + from, 0, (size_t)(upto - from) * sizeof(double)); break;
    default: memset(c->ints + from, 0, (size_t)(upto - from) * sizeof(int64_t));
    }
    if (offsets)
        for (int64_t r = from; r < upto; r++) offsets[r + 1] = end;
    s->filled[i] = upto;
}

/* fill_gap where there is a gap: most columns of a Kineto event were written on the row before. */
static inline void fill_to(scan_t *s, int32_t i, int64_t upto) {
    if (s->filled[i] < upto) fill_gap(s, i, upto);
}

/* Row `row` of column i is written (valid or not): close its offsets. */
static inline void finish_row(scan_t *s, int32_t i, int64_t row, int valid) {
    column_t *c = &s->spec->columns[i];
    fill_to(s, i, row);
    c->valid[row] = (uint8_t)valid;
    c->present += valid;
    switch (c->kind) {
    case K_STR: c->offsets[row + 1] = (int32_t)c->heap_len; break;
    case K_INT_LIST: c->offsets[row + 1] = (int32_t)c->values_len; break;
    case K_INT_LIST_LIST:
    case K_STR_LIST: c->offsets[row + 1] = (int32_t)c->inner_len; break;
    case K_FLOAT: if (!valid) c->floats[row] = 0; break;
    default: if (!valid) c->ints[row] = 0;
    }
    s->filled[i] = row + 1;
}

/* Index of the lowest set bit of m (m != 0). */
static inline int lowest_bit(uint64_t m) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(m);
#else
    int i = 0;
    while (!(m & 1)) m >>= 1, i++;
    return i;
#endif
}

/* Commit one whole, valid event at [start, end). Returns 1 if kept, 0 if filtered out,
 * -1 when there is no room (nothing written).  Only the columns the event has a value for are
 * visited (s->touched, in column order as before): a Kineto event names a quarter of them, and
 * looping over all of them twice per event was a sixth of the scan. */
static int commit(scan_t *s, int64_t start, int64_t end, int64_t row, result_t *r) {
    const spec_t *sp = s->spec;
    const uint8_t *b = s->b;
    const slot_t *ph = &s->slots[sp->ph_column];
    if (ph->gen != s->gen || ph->type != T_STR || ph->escaped || ph->end - ph->start != 3 ||
        !sp->keep_ph[b[ph->start + 1]])
        return 0;
    if (row >= sp->rows_cap) {
        r->full_column = -1;
        return -1;
    }
    for (uint64_t m = s->touched & s->sized; m; m &= m - 1) {
        int32_t i = lowest_bit(m);
        const slot_t *sl = &s->slots[i];
        const column_t *c = &sp->columns[i];
        if (!has_room(c, sl)) {
            r->full_column = i;
            return -1;
        }
        if (c->kind == K_ID && c->label >= 0 && sl->type == T_STR && !has_room(&sp->columns[c->label], sl)) {
            r->full_column = c->label;
            return -1;
        }
    }
    int slow = s->bad_key;
    for (uint64_t m = s->touched & ~s->labels; m; m &= m - 1) { /* labels: after their id column */
        int32_t i = lowest_bit(m);
        const slot_t *sl = &s->slots[i];
        column_t *c = &sp->columns[i];
        int valid = 0;
        if (!slow && sl->type != T_NULL) {
            /* the column may already be written up to before this row: fill the gap first */
            fill_to(s, i, row);
            if (c->kind == K_ID && c->label >= 0) fill_to(s, c->label, row);
            int ok = convert(b, sp, c, sl, row);
            if (!ok) slow = 1;
            if (ok == 2) finish_row(s, c->label, row, 1);
            valid = ok == 1;
        }
        finish_row(s, i, row, valid);
    }
    if (slow) {
        sp->slow_rows[r->slow] = row;
        sp->slow_start[r->slow] = start;
        sp->slow_end[r->slow] = end;
        r->slow++;
    }
    return 1;
}

/* Scan whole events from b[pos] on into the spec's columns, after the r->rows rows already
 * there (0: the columns start empty; else the caller kept the columns, their lengths and
 * `present` as the last call left them).  Returns the rows in the columns, or -1 for a bad spec. */
int64_t es_scan(const uint8_t *b, int64_t n, int64_t pos, const spec_t *spec, result_t *r) {
    init_tables();
    scan_t *s = (scan_t *)calloc(1, sizeof(scan_t));
    if (!s) return -1;
    s->b = b;
    s->n = n;
    s->spec = spec;
    if (spec->ncolumns > MAX_COLUMNS || spec->ph_column < 0 || spec->ph_column >= spec->ncolumns ||
        !build_keys(s)) {
        free(s);
        return -1;
    }
    if (r->rows < 0 || r->rows > spec->rows_cap) {
        free(s);
        return -1;
    }
    for (int32_t i = 0; i < spec->ncolumns; i++) {
        column_t *c = &spec->columns[i];
        if (c->kind == K_ID && c->label >= 0) s->labels |= (uint64_t)1 << c->label;
        if (c->kind != K_INT && c->kind != K_TIME && c->kind != K_FLOAT && (c->kind != K_ID || c->label >= 0))
            s->sized |= (uint64_t)1 << i; /* its value takes room in a heap (its own or its label's) */
        if (c->offsets) c->offsets[0] = 0;
        if (c->inner) c->inner[0] = 0;
        /* a column with a value was filled to the last row; one without is all null and empty
         * (lengths 0), so filling it again from row 0 rewrites the same nulls */
        s->filled[i] = c->present ? r->rows : 0;
    }
    r->events = 0;
    r->slow = 0;
    r->full_column = -1;
    r->lone_surrogates = 0;
    int64_t p = pos;
    for (;;) {
        while (p < n && (is_ws(b[p]) || b[p] == ',')) p++;
        if (p >= n) {
            r->status = SCAN_NEED_MORE;
            break;
        }
        if (b[p] == ']') {
            r->status = SCAN_END;
            break;
        }
        if (b[p] != '{') {
            r->status = SCAN_INVALID;
            break;
        }
        s->gen++;
        if (s->gen == 0) { /* wrapped: forget every slot */
            memset(s->slots, 0, sizeof(s->slots));
            s->gen = 1;
        }
        s->bad_key = 0;
        s->touched = 0;
        s->lone = 0;
        int64_t end = scan_container(s, p, 1, 1, 0);
        if (end == NEED_MORE) {
            r->status = SCAN_NEED_MORE;
            break;
        }
        if (end < 0) {
            r->status = SCAN_INVALID;
            break;
        }
        int kept = commit(s, p, end, r->rows, r);
        if (kept < 0) {
            r->status = SCAN_FULL;
            break;
        }
        r->rows += kept;
        r->events++;
        r->lone_surrogates += s->lone;
        p = end;
    }
    r->pos = p;
    for (int32_t i = 0; i < spec->ncolumns; i++)
        if (s->filled[i]) fill_to(s, i, r->rows);
    free(s);
    return r->rows;
}

/* ---------- text assembly for the writers ---------- */

/* Copy strings of an Arrow string array (int32 offsets) into out, one after another, in the order
 * given: how export/text.py lays out a chunk of trace_view.json.  Arrow's take does the same with
 * an offsets array and validity bookkeeping the writer then throws away.  Returns bytes written,
 * or -1 when out (cap bytes) is too small or an index is outside [0, count). */
int64_t es_gather(const int32_t *offsets, int64_t count, const uint8_t *data, const int32_t *order, int64_t n,
                  uint8_t *out, int64_t cap) {
    int64_t w = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t k = order[i];
        if (k < 0 || k >= count) return -1;
        int64_t start = offsets[k], len = (int64_t)offsets[k + 1] - start;
        if (len < 0 || w + len > cap) return -1;
        memcpy(out + w, data + start, (size_t)len);
        w += len;
    }
    return w;
}

/* ---------- rows of text for the writers ---------- */

/* One piece of every row of text (see export/text.py, TextRows): a text chosen per row from a
 * pool, a string column, an integer, or exact microseconds from integer nanoseconds.  A piece that
 * is an object member ("key") is written with its key, after a comma when an earlier member of
 * the same object was written; a null member is left out, key and all. */
enum { F_POOL = 1, F_STR = 2, F_INT = 3, F_US = 4 };

typedef struct {
    int32_t kind;
    int32_t opens;          /* 1: an object opens after this piece (no member written yet) */
    const int32_t *codes;   /* F_POOL: pool index per row, < 0 for nothing; NULL: index 0 */
    const int32_t *offsets; /* F_POOL, F_STR: Arrow int32 offsets (the array's offset applied) */
    const uint8_t *data;    /* F_POOL, F_STR: the string bytes */
    const uint8_t *bitmap;  /* F_STR: Arrow validity bitmap, or NULL (all valid) */
    int64_t bit_offset;     /* F_STR: the array's offset into its bitmap */
    const uint8_t *present; /* F_INT, F_US: one byte per row, 0 for null; NULL: all present */
    const int64_t *values;  /* F_INT, F_US */
    int64_t count;          /* F_POOL: texts in the pool */
    const uint8_t *key;     /* object member: its key text ("\"step\":"), else NULL */
    int64_t key_len;
} piece_t;

/* Decimal text of v at dst (room for 20 bytes); returns bytes written.  Two digits at a time. */
static int write_uint(uint64_t v, uint8_t *dst) {
    static const char pairs[201] =
        "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
        "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
        "8081828384858687888990919293949596979899";
    uint8_t tmp[20];
    int n = 20;
    while (v >= 100) {
        unsigned d = (unsigned)(v % 100) * 2;
        v /= 100;
        tmp[--n] = (uint8_t)pairs[d + 1];
        tmp[--n] = (uint8_t)pairs[d];
    }
    if (v >= 10) {
        tmp[--n] = (uint8_t)pairs[v * 2 + 1];
        tmp[--n] = (uint8_t)pairs[v * 2];
    } else {
        tmp[--n] = (uint8_t)('0' + v);
    }
    memcpy(dst, tmp + n, (size_t)(20 - n));
    return 20 - n;
}

/* memcpy for the short texts rows are made of (keys, numbers, ids): libc's call costs more than
 * the copy.  Reads and writes stay inside [src, src + len) and [dst, dst + len). */
static inline void copy_text(uint8_t *dst, const uint8_t *src, int64_t len) {
    if (len >= 8 && len <= 16) {
        uint64_t head, tail;
        memcpy(&head, src, 8);
        memcpy(&tail, src + len - 8, 8);
        memcpy(dst, &head, 8);
        memcpy(dst + len - 8, &tail, 8);
    } else if (len < 8) {
        for (int64_t i = 0; i < len; i++) dst[i] = src[i];
    } else {
        memcpy(dst, src, (size_t)len);
    }
}

/* Rows [lo, hi) laid out end to end into out (cap bytes).  Returns the bytes written; *done is
 * the number of whole rows written (fewer than hi - lo when out is full).  -1 for a pool index
 * outside its pool. */
int64_t es_format(const piece_t *pieces, int32_t npieces, int64_t lo, int64_t hi, uint8_t *out, int64_t cap,
                  int64_t *done) {
    int64_t w = 0;
    *done = 0;
    for (int64_t row = lo; row < hi; row++) {
        int64_t row_start = w;
        int member = 0;
        for (int32_t k = 0; k < npieces; k++) {
            const piece_t *pc = &pieces[k];
            const uint8_t *text = NULL;
            int64_t len = 0;
            uint8_t number[32];
            switch (pc->kind) {
            case F_POOL: {
                int64_t code = pc->codes ? pc->codes[row] : 0;
                if (code >= pc->count) return -1;
                if (code >= 0) {
                    text = pc->data + pc->offsets[code];
                    len = pc->offsets[code + 1] - pc->offsets[code];
                }
                break;
            }
            case F_STR: {
                int64_t bit = pc->bit_offset + row;
                if (!pc->bitmap || (pc->bitmap[bit >> 3] >> (bit & 7)) & 1) {
                    text = pc->data + pc->offsets[row];
                    len = pc->offsets[row + 1] - pc->offsets[row];
                }
                break;
            }
            case F_INT:
            case F_US: {
                if (pc->present && !pc->present[row]) break;
                int64_t v = pc->values[row];
                uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
                int n = 0;
                if (v < 0) number[n++] = '-';
                if (pc->kind == F_INT) {
                    n += write_uint(mag, number + n);
                } else {
                    uint64_t frac = mag % 1000;
                    n += write_uint(mag / 1000, number + n);
                    number[n++] = '.';
                    number[n++] = (uint8_t)('0' + frac / 100);
                    number[n++] = (uint8_t)('0' + frac / 10 % 10);
                    number[n++] = (uint8_t)('0' + frac % 10);
                }
                text = number;
                len = n;
                break;
            }
            default:
                return -1;
            }
            if (pc->key) {
                if (!text) continue; /* a null member is left out */
                if (w + 1 + pc->key_len > cap) goto full;
                if (member) out[w++] = ',';
                copy_text(out + w, pc->key, pc->key_len);
                w += pc->key_len;
                member = 1;
            }
            if (text) {
                if (w + len > cap) goto full;
                copy_text(out + w, text, len);
                w += len;
            }
            if (pc->opens) member = 0;
        }
        (*done)++;
        continue;
    full:
        return row_start;
    }
    return w;
}
