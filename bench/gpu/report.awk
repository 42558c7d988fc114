# Gathers the validation run's records (JSON lines from the driver, the
# harness, validate.sh and torch_decode.py) into one JSON file and prints
# the summary table. Plain awk (a bare host has no jq or Python for sure).
#
#   awk -v gpu=NAME -v commit=SHA -v date=ISO -v mode=gpu|no-gpu -v seconds=N \
#       -v json=OUT.json -f report.awk records.jsonl
#
# The targets are the GPU issues' bars, each read from the figures and
# checks of this run; a figure a run did not measure leaves its target unmet.

function str(line, key,    s) {
    if (!match(line, "\"" key "\": *\"([^\"\\\\]|\\\\.)*\"")) return ""
    s = substr(line, RSTART, RLENGTH)
    sub("^\"" key "\": *\"", "", s)
    sub("\"$", "", s)
    return s
}
function num(line, key,    s) {
    if (!match(line, "\"" key "\": *-?[0-9.]+([eE][-+]?[0-9]+)?")) return ""
    s = substr(line, RSTART, RLENGTH)
    sub("^\"" key "\": *", "", s)
    return s + 0
}
function esc(s) {
    gsub(/\\/, "\\\\", s)
    gsub(/"/, "\\\"", s)
    return s
}
function fig(engine, model, loops, rows) { return figures[engine SUBSEP model SUBSEP loops SUBSEP rows SUBSEP ""] + 0 }
# A figure exiting by the gate ("exact 0.7"), and the mean steps its tokens ran.
function fig_exit(engine, model, loops, rows, rule) { return figures[engine SUBSEP model SUBSEP loops SUBSEP rows SUBSEP rule] + 0 }
function target(name, value, bar, met, shown) {
    n_targets++
    t_name[n_targets] = name
    t_value[n_targets] = value
    t_bar[n_targets] = bar
    t_met[n_targets] = met
    t_shown[n_targets] = shown
}
# A measured ratio or figure as a target: value v when the run measured it (v > 0), else "not measured".
function measured(name, v, bar, met, fmt) {
    if (v > 0) target(name, v, bar, met, sprintf(fmt, v))
    else target(name, "\"not measured\"", bar, 0, "not measured")
}

/^\{"kind":"check"/ {
    n_checks++
    checks[n_checks] = $0
    status = str($0, "status")
    count[status]++
    name = str($0, "name")
    if (status == "fail") failed[++n_failed] = name ": " str($0, "detail")
    if (status == "skip") skipped[++n_skipped] = name ": " str($0, "detail")
    check_status[name] = status
    check_value[name] = num($0, "value")
    next
}
/^\{"kind":"figure"/ {
    figures[str($0, "engine") SUBSEP str($0, "model") SUBSEP num($0, "loops") SUBSEP num($0, "rows") SUBSEP str($0, "exit")] = num($0, "tok_s")
    fig_lines[++n_figs] = $0
    next
}
/^\{"kind":"peer"/ {
    engine = str($0, "engine")
    if (engine == "device copy") { copy_gb_s = num($0, "gb_s"); next }
    if (str($0, "error") != "" || num($0, "tok_s") == "") { peer_errors[++n_peer_errors] = engine ": " str($0, "error"); next }
    line = sprintf("{\"kind\":\"figure\",\"engine\":\"%s\",\"model\":\"%s\",\"weights\":\"fp16\",\"loops\":%d,\"rows\":%d,\"tok_s\":%.6g}",
                   esc(engine), esc(str($0, "model")), num($0, "loops"), num($0, "rows"), num($0, "tok_s"))
    figures[engine SUBSEP str($0, "model") SUBSEP num($0, "loops") SUBSEP num($0, "rows") SUBSEP ""] = num($0, "tok_s")
    fig_lines[++n_figs] = line
    next
}

END {
    # ---- targets ----
    target("checks failing", count["fail"] + 0, sprintf("0 of %d run", count["pass"] + count["fail"]),
           count["fail"] == 0 && count["pass"] > 0, count["fail"] + 0)
    clean = check_status["sanitizer/memcheck"] == "pass" && check_status["sanitizer/racecheck"] == "pass"
    target("compute-sanitizer memcheck and racecheck clean", clean ? "true" : "false", "both pass", clean, clean ? "yes" : "no")
    target("validation run seconds", seconds + 0, "<= 480", seconds <= 480, seconds)
    verified = check_value["library/cuda-features"]
    target("int4 and int2 on by default on the GPU (verified kernel families)", verified + 0, "includes LS_CUDA_KERNELS_QUANT (1)",
           verified % 2 == 1, verified + 0)
    l = "loopserve"; d = "dim2048-fp16"; q = "dim2048-int4"
    measured("int4 dim-2048 one stream loops 8 x its fp16", fig(l, d, 8, 1) > 0 ? fig(l, q, 8, 1) / fig(l, d, 8, 1) : 0,
             ">= 1.5", fig(l, d, 8, 1) > 0 && fig(l, q, 8, 1) / fig(l, d, 8, 1) >= 1.5, "%.2f")
    one = fig(l, d, 8, 1)
    measured("one stream dim-2048 fp16 loops 8 tok/s", one, ">= 3000", one >= 3000, "%.0f")
    peer = fig("pytorch cuda graph", d, 8, 1)
    measured("one stream dim-2048 fp16 loops 8 x pytorch cuda graph", peer > 0 ? one / peer : 0, ">= 3", peer > 0 && one / peer >= 3, "%.2f")
    # bytes a dim-2048 token reads at loops 8: the block 8 times, the head once
    dm = 2048; kv = 512; ffn = 5632; vocab = 50257
    token_bytes = 8 * 2 * (2 * dm * dm + 2 * kv * dm + 3 * ffn * dm) + 2 * vocab * dm
    frac = copy_gb_s > 0 ? one * token_bytes / (copy_gb_s * 1e9) : 0
    measured("one stream dim-2048 fp16 loops 8: fraction of the copy bandwidth", frac, ">= 0.65", frac >= 0.65, "%.2f")
    extra = fig(l, d, 16, 1) > 0 && one > 0 ? (1000 / fig(l, d, 16, 1) - 1000 / one) / 8 : 0
    measured("extra loop dim-2048 fp16 ms (loops 8 -> 16)", extra, "<= 0.040", extra > 0 && extra <= 0.040, "%.4f")
    extra4 = fig(l, q, 16, 1) > 0 && fig(l, q, 8, 1) > 0 ? (1000 / fig(l, q, 16, 1) - 1000 / fig(l, q, 8, 1)) / 8 : 0
    measured("extra loop dim-2048 int4 ms (loops 8 -> 16)", extra4, "<= 0.015", extra4 > 0 && extra4 <= 0.015, "%.4f")
    trained = fig(l, "trained", 8, 1)
    measured("one stream trained model loops 8 tok/s", trained, ">= 8000", trained >= 8000, "%.0f")
    rows64 = fig("pytorch cuda graph", d, 8, 64) > 0 ? fig(l, d, 8, 64) / fig("pytorch cuda graph", d, 8, 64) : 0
    measured("64 rows dim-2048 fp16 loops 8 x pytorch cuda graph (kernel level)", rows64, ">= 1.5", rows64 >= 1.5, "%.2f")
    # issue 54: stacks and the exit gate
    target("stacks and the exit gate on by default on the GPU (verified kernel families)", verified + 0,
           "includes LS_CUDA_KERNELS_STACKS (2)", int(verified / 2) % 2 == 1, verified + 0)
    # bytes an Ouro-1.4B-shaped token reads at 4 steps: the 24 layers 4 times (16 kv heads), the head once
    o = "ouro-1.4b"; ofull = fig(l, o, 4, 1)
    ouro_bytes = 4 * 24 * 2 * (4 * dm * dm + 3 * ffn * dm) + 2 * 49152 * dm
    ofrac = copy_gb_s > 0 ? ofull * ouro_bytes / (copy_gb_s * 1e9) : 0
    measured("Ouro-1.4B shape one stream 4 steps fp16: fraction of the copy bandwidth", ofrac, ">= 0.50", ofrac >= 0.5, "%.2f")
    oexact = ofull > 0 ? fig_exit(l, o, 4, 1, "exact 0.7") / ofull : 0
    measured("Ouro-1.4B shape one stream: exit at 0.7 (exact) x 4 steps tok/s", oexact, "> 1", oexact > 1, "%.2f")
    ocopy = ofull > 0 ? fig_exit(l, o, 4, 1, "copy 0.7") / ofull : 0
    measured("Ouro-1.4B shape one stream: exit at 0.7 (copy) x 4 steps tok/s", ocopy, "> 1", ocopy > 1, "%.2f")
    target("llama.cpp CUDA peer beside loopserve", check_status["figures/llama-cpp"] == "pass" ? "true" : "false", "present",
           check_status["figures/llama-cpp"] == "pass", check_status["figures/llama-cpp"] == "pass" ? "yes" : "no")

    # ---- the JSON ----
    printf("{\n  \"gpu\": \"%s\",\n  \"commit\": \"%s\",\n  \"date\": \"%s\",\n  \"mode\": \"%s\",\n  \"seconds\": %d,\n",
           esc(gpu), esc(commit), date, mode, seconds) > json
    printf("  \"summary\": {\"pass\": %d, \"fail\": %d, \"skip\": %d},\n", count["pass"], count["fail"], count["skip"]) > json
    printf("  \"copy_gb_s\": %s,\n  \"dim2048_token_bytes\": %d,\n  \"ouro_1_4b_token_bytes\": %.0f,\n", (copy_gb_s > 0 ? copy_gb_s : "null"),
           token_bytes, ouro_bytes) > json
    printf("  \"checks\": [\n") > json
    for (i = 1; i <= n_checks; i++) printf("    %s%s\n", checks[i], (i < n_checks ? "," : "")) > json
    printf("  ],\n  \"figures\": [\n") > json
    for (i = 1; i <= n_figs; i++) printf("    %s%s\n", fig_lines[i], (i < n_figs ? "," : "")) > json
    printf("  ],\n  \"targets\": [\n") > json
    for (i = 1; i <= n_targets; i++)
        printf("    {\"name\": \"%s\", \"value\": %s, \"bar\": \"%s\", \"met\": %s}%s\n", esc(t_name[i]), t_value[i],
               esc(t_bar[i]), (t_met[i] ? "true" : "false"), (i < n_targets ? "," : "")) > json
    printf("  ]\n}\n") > json
    close(json)

    # ---- the summary, printed last ----
    printf "\n== GPU validation: %s, commit %s, %s mode, %d s ==\n", gpu, substr(commit, 1, 12), mode, seconds
    printf "checks: %d pass, %d fail, %d skip\n", count["pass"], count["fail"], count["skip"]
    for (i = 1; i <= n_failed; i++) printf "  FAIL %s\n", failed[i]
    for (i = 1; i <= n_skipped; i++) printf "  skip %s\n", skipped[i]
    for (i = 1; i <= n_peer_errors; i++) printf "  peer error %s\n", peer_errors[i]
    if (n_figs > 0) {
        printf "\n%-28s %-16s %-8s %5s %5s %-10s %12s %6s\n", "engine", "model", "weights", "loops", "rows", "exit", "tok/s", "steps"
        for (i = 1; i <= n_figs; i++) {
            steps = num(fig_lines[i], "mean_steps")
            printf "%-28s %-16s %-8s %5d %5d %-10s %12.1f %6s\n", str(fig_lines[i], "engine"), str(fig_lines[i], "model"),
                   str(fig_lines[i], "weights"), num(fig_lines[i], "loops"), num(fig_lines[i], "rows"), str(fig_lines[i], "exit"),
                   num(fig_lines[i], "tok_s"), steps == "" ? "" : sprintf("%.2f", steps)
        }
    }
    if (copy_gb_s > 0) printf "device copy: %.0f GB/s (bytes read and written)\n", copy_gb_s
    printf "\n%-78s %14s %-36s %s\n", "target", "value", "bar", "met"
    for (i = 1; i <= n_targets; i++) printf "%-78s %14s %-36s %s\n", t_name[i], t_shown[i], t_bar[i], t_met[i] ? "yes" : "no"
}
