/* roles: the SWARM subcommands of cirrus-trainer, one file each: stage.c, client.c,
 * local.c and gateway.c (what they share: roles_common.h). Each takes the arguments after
 * the subcommand name and returns the process exit code. */
#ifndef CIRRUS_ROLES_H
#define CIRRUS_ROLES_H

int roles_cmd_stage(int argc, char **argv);
int roles_cmd_client(int argc, char **argv);
int roles_cmd_local(int argc, char **argv);
/* The region's gateway: for now its coordinator (membership, /status, /metrics). */
int roles_cmd_gateway(int argc, char **argv);

#endif
