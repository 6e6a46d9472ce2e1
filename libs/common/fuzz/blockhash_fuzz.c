/* libFuzzer harness for the msgpack token arrays that _blockhash.c reads from engines' KV
 * events (BlockStored token_ids, kept raw by the router's decoder): token_count,
 * check_token_cells and msgpack_block_hashes walk them with read_array_header, read_cell
 * (its fast path and its slow one, which skips any msgpack value of a bigram cell) and
 * skip_value. The harness calls those readers as the three functions do, without an
 * interpreter (the Python glue around them is not run); the block hash runs over what was
 * read.
 *
 * The first input byte is the block size (1-16); the rest is the raw array.
 *
 *   make fuzz                    (builds with clang -fsanitize=fuzzer,address,undefined)
 */
#include "../_blockhash.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t block_size = (size_t)(data[0] % 16) + 1;
    Reader r = {data + 1, data + size};
    int64_t n = read_array_header(&r);
    if (n < 0)
        return 0;
    /* check_token_cells: every cell, an int or [int, any] */
    Reader cells = r;
    for (int64_t i = 0; i < n; i++) {
        uint32_t token;
        int status = read_cell(&cells, &token);
        if (status != CELL_OK && status != CELL_RANGE)
            break;
        if (cells.p > cells.end)
            abort();
    }
    /* msgpack_block_hashes: the full blocks, each hashed as it is read */
    static int ready = 0;
    if (!ready) { /* as PyInit__blockhash does */
        derive_secret(seed_secret, SEED);
        ready = 1;
    }
    uint8_t block[8 + 4 * 16];
    uint64_t parent = 0;
    for (int64_t b = 0; b < n / (int64_t)block_size; b++) {
        for (size_t t = 0; t < block_size; t++) {
            uint32_t token;
            if (read_cell(&r, &token) != CELL_OK)
                return 0;
            if (r.p > r.end)
                abort();
            write32(block + 8 + 4 * t, token);
        }
        write64(block, parent);
        parent = b == 0 ? block_hash(block + 8, 4 * block_size)
                        : block_hash(block, 8 + 4 * block_size);
    }
    return 0;
}
