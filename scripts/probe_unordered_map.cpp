// Dev-only: shows libstdc++ unordered_map behaviour that llamacpy.tokenizer._hashorder replays.
// g++ -O2 -o probe scripts/probe_unordered_map.cpp
//   ./probe buckets            -> "n bucket_count" each time the bucket count changes (BUCKET_STEPS)
//   ./probe order < tokens.bin -> ids in iteration order of map[token_i] = i
//   (tokens.bin: each token as a little-endian u32 length + bytes)
#include <unordered_map>
#include <string>
#include <vector>
#include <cstdio>
#include <cstdint>
#include <iostream>
int main(int argc, char** argv) {
    std::string mode = argv[1];
    if (mode == "buckets") {
        std::unordered_map<std::string, int> m;
        size_t last = m.bucket_count();
        printf("0 %zu\n", last);
        for (int i = 0; i < 4200000; i++) {
            m[std::to_string(i)] = i;
            if (m.bucket_count() != last) { last = m.bucket_count(); printf("%d %zu\n", i + 1, last); }
        }
        return 0;
    }
    // read length-prefixed strings from stdin
    std::vector<std::string> toks;
    uint32_t len;
    while (fread(&len, 4, 1, stdin) == 1) {
        std::string s(len, '\0');
        if (len && fread(&s[0], 1, len, stdin) != len) return 1;
        toks.push_back(s);
    }
    if (mode == "hash") {
        for (auto & s : toks) printf("%zu\n", std::hash<std::string>{}(s));
        return 0;
    }
    std::unordered_map<std::string, int> m;
    for (size_t i = 0; i < toks.size(); i++) m[toks[i]] = (int) i;
    for (auto & kv : m) printf("%d\n", kv.second);
    return 0;
}
