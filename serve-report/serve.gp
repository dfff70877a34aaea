set terminal pngcairo size 900,560
set key top left
set logscale x 2
set xlabel 'requests per second'
set ylabel 'TTFT p99 (ms)'
set logscale y
