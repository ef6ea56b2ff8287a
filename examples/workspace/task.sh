# A small agent task for the docker-compose stack (and tests/e2e/test_compose.py).
# Every exec below is decided by the policy service.
set -u
echo "building in $(pwd)"
printf 'hello from the agent\n' > out.txt
wc -l < out.txt
sudo true || echo "sudo was refused (status $?)"
echo "done"
