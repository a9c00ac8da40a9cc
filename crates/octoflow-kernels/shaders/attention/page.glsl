// Paged KV caches (position-table mode). A sequence's cache is a list of blocks of KV_PAGE
// rows anywhere in the cache buffers: its block table is a run of u32 block ids in the `pos`
// buffer (after the per-token pairs), and a token's second pair word is where its sequence's
// table starts. Position j of that sequence lives in cache row
// table[j / KV_PAGE] * KV_PAGE + j % KV_PAGE. Sequences may share blocks (a cached prefix).
// The host validates the tables; these macros only keep a bad one from reaching past the
// buffers (an entry past `pos` or a block past `rows` gives `rows`: not read, not written).
#define KV_PAGE 16u
#define PAGE_ID(arr, bt, j) \
    ((bt) + (j) / KV_PAGE < uint(arr.length()) ? arr[(bt) + (j) / KV_PAGE] : 0xffffffffu)
#define PAGE_ROW(arr, bt, j, rows) \
    (PAGE_ID(arr, bt, j) < (rows) / KV_PAGE ? PAGE_ID(arr, bt, j) * KV_PAGE + (j) % KV_PAGE : (rows))
