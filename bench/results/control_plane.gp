set terminal pngcairo size 1500,900
set output 'bench/results/control_plane.png'
set multiplot layout 2,3
set logscale xy
set xlabel 'offered calls/s'
set ylabel 'p99 ms'
set key top left
set arrow from graph 0, first 50 to graph 1, first 50 nohead dt 2
set title 'Generate'
plot 'bench/results/control_plane_levels.dat' index 0 using 1:2 smooth unique with linespoints title 'echo', '' index 1 using 1:2 smooth unique with linespoints title 'service'
set title 'Score'
plot 'bench/results/control_plane_levels.dat' index 2 using 1:2 smooth unique with linespoints title 'echo', '' index 3 using 1:2 smooth unique with linespoints title 'service'
set title 'PutExperiences'
plot 'bench/results/control_plane_levels.dat' index 4 using 1:2 smooth unique with linespoints title 'echo', '' index 5 using 1:2 smooth unique with linespoints title 'service'
set title 'StreamExperiences'
plot 'bench/results/control_plane_levels.dat' index 6 using 1:2 smooth unique with linespoints title 'echo', '' index 7 using 1:2 smooth unique with linespoints title 'service'
set title 'GetState'
plot 'bench/results/control_plane_levels.dat' index 8 using 1:2 smooth unique with linespoints title 'echo', '' index 9 using 1:2 smooth unique with linespoints title 'service'
set title 'Heartbeat'
plot 'bench/results/control_plane_levels.dat' index 10 using 1:2 smooth unique with linespoints title 'echo', '' index 11 using 1:2 smooth unique with linespoints title 'service'
unset multiplot
