# Reads ptxas's -v report (nvcc -Xptxas -v) and fails, naming the kernel
# and architecture, when any function spills registers to local memory:
# the CUDA kernels are written to keep their state in registers, and a
# spill is a slowdown no test would see. bench/gpu/Makefile runs it on
# every CUDA object.
/Compiling entry function/ { name = $0; sub(/.*entry function '/, "", name); sub(/'.*/, "", name); arch = $NF }
/Function properties for/ { name = $NF }
/bytes spill stores/ {
    n = split($0, f, /[ ,]+/)
    for (i = 1; i + 3 <= n; i++) {
        if (f[i + 2] == "spill" && f[i + 3] == "stores" && f[i] + 0 > 0) bad = bad "\n  " name " " arch ": " f[i] " bytes of spill stores"
        if (f[i + 2] == "spill" && f[i + 3] == "loads" && f[i] + 0 > 0) bad = bad "\n  " name " " arch ": " f[i] " bytes of spill loads"
    }
}
END {
    if (bad != "") {
        print FILENAME ": register spills (ptxas -v):" bad
        exit 1
    }
}
