#!/usr/bin/perl
# PID 1 of one fake SLURM node (started by ci/slurm-cluster.sh inside the node's own
# network, UTS and PID namespaces).
#
# Why a wrapper: in a PID namespace, orphaned job processes are re-parented to PID 1; slurmd
# never reaps them (finished jobs would stay zombies), and PID 1 gets no default signal
# handling.  This sets the node's hostname, runs the given command (slurmd -D ...) as its
# child, forwards TERM/INT/HUP to it, reaps every child, and when the command exits it
# TERMs whatever is left in the namespace (job steps), waits up to 5 s, and exits with the
# command's status (the kernel then KILLs any straggler as the namespace dies).
#
# Perl because perl-base is Essential on Debian: nothing to install or compile.
use strict;
use warnings;
use POSIX qw(WNOHANG);

my ($node, @cmd) = @ARGV;
die "usage: node-init.pl NODE COMMAND [ARGS...]\n" unless defined $node && @cmd;

system('hostname', $node) == 0 or die "node-init: cannot set hostname to '$node'\n";

my $child = fork() // die "node-init: fork failed: $!\n";
if ($child == 0) {
    exec { $cmd[0] } @cmd or die "node-init: cannot exec $cmd[0]: $!\n";
}

my $stopping = 0;
for my $sig (qw(TERM INT HUP)) {
    $SIG{$sig} = sub { $stopping = 1; kill $sig, $child if $child > 0; };
}

my $status = 0;
while (1) {
    my $pid = waitpid(-1, 0);
    if ($pid == -1) {
        next if $!{EINTR};
        last;                            # no children at all
    }
    if ($pid == $child) {
        $status = $? >> 8 || ($? & 127 ? 128 + ($? & 127) : 0);
        $child = 0;
        last;
    }
    # any other pid: an orphan re-parented to us, now reaped
}

# The node is going away: give job processes a chance to exit cleanly.
kill 'TERM', -1;
my $deadline = time + 5;
while (time < $deadline) {
    my $pid = waitpid(-1, WNOHANG);
    last if $pid == -1;                  # nothing left
    select(undef, undef, undef, 0.1) if $pid == 0;
}
exit $status;
