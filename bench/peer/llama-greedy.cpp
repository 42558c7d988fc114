// llama-greedy: greedy decoding through libllama on given token ids, for
// bench/peer.ts's equivalence check. Built by build-llama.sh against the
// llama.cpp tree it compiles (never committed with it).
//
// usage: llama-greedy -m MODEL.gguf -p ID,ID,... [-n N] [-t THREADS] [-o LOGITS.f32]
//
// Prefills the prompt ids in one batch, then takes the argmax of the logits
// N times (ties to the lower id, as loopserve's greedy does), feeding each
// token back. Prints "tokens: a b c ..." on stdout. With -o, writes the N
// logits rows it took the argmax of (float32, vocab values each, row k
// predicts generated token k) so the caller can compare them with another
// engine's logits on the same sequence. Token ids in and out: no tokenizer
// is involved, so both engines see exactly the same input.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int usage(const char * argv0) {
    fprintf(stderr, "usage: %s -m MODEL.gguf -p ID,ID,... [-n N] [-t THREADS] [-o LOGITS.f32]\n", argv0);
    return 2;
}

int main(int argc, char ** argv) {
    std::string model_path, prompt_arg, logits_path;
    int n_predict = 32;
    int threads = 1;
    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        if (i + 1 >= argc) return usage(argv[0]);
        if (!strcmp(a, "-m")) model_path = argv[++i];
        else if (!strcmp(a, "-p")) prompt_arg = argv[++i];
        else if (!strcmp(a, "-n")) n_predict = atoi(argv[++i]);
        else if (!strcmp(a, "-t")) threads = atoi(argv[++i]);
        else if (!strcmp(a, "-o")) logits_path = argv[++i];
        else return usage(argv[0]);
    }
    if (model_path.empty() || prompt_arg.empty() || n_predict < 1 || threads < 1) return usage(argv[0]);

    std::vector<llama_token> prompt;
    for (const char * s = prompt_arg.c_str(); *s;) {
        char * end = nullptr;
        long v = strtol(s, &end, 10);
        if (end == s) {
            fprintf(stderr, "llama-greedy: bad token list near \"%s\"\n", s);
            return 2;
        }
        prompt.push_back((llama_token) v);
        s = *end == ',' ? end + 1 : end;
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) {
        fprintf(stderr, "llama-greedy: cannot load %s\n", model_path.c_str());
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (llama_token t : prompt) {
        if (t < 0 || t >= n_vocab) {
            fprintf(stderr, "llama-greedy: token %d outside the vocabulary (%d)\n", t, n_vocab);
            return 2;
        }
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (prompt.size() + n_predict + 16);
    cp.n_batch = (uint32_t) prompt.size();
    cp.n_ubatch = (uint32_t) prompt.size();
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama-greedy: cannot create a context\n");
        return 1;
    }

    FILE * lf = nullptr;
    if (!logits_path.empty()) {
        lf = fopen(logits_path.c_str(), "wb");
        if (!lf) {
            fprintf(stderr, "llama-greedy: cannot write %s\n", logits_path.c_str());
            return 1;
        }
    }

    std::vector<llama_token> out;
    llama_batch batch = llama_batch_get_one(prompt.data(), (int32_t) prompt.size());
    llama_token next = 0;
    for (int k = 0; k < n_predict; k++) {
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama-greedy: llama_decode failed at step %d\n", k);
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int v = 1; v < n_vocab; v++) {
            if (logits[v] > logits[best]) best = v;
        }
        if (lf && fwrite(logits, sizeof(float), (size_t) n_vocab, lf) != (size_t) n_vocab) {
            fprintf(stderr, "llama-greedy: short write to %s\n", logits_path.c_str());
            return 1;
        }
        next = best;
        out.push_back(next);
        batch = llama_batch_get_one(&next, 1);
    }
    if (lf) fclose(lf);

    printf("tokens:");
    for (llama_token t : out) printf(" %d", t);
    printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
