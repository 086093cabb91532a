export PYTHONPATH=.
python3 scripts/grouped_ncu.py > $OUT/times.txt 2>&1
timeout 400 ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis python3 scripts/grouped_ncu.py --once > $OUT/ncu.txt 2>&1
echo rc=$? >> $OUT/ncu.txt
cat $OUT/times.txt
grep -E "^  [a-zA-Z_]|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Stall|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc" $OUT/ncu.txt | head -150
