"""Create a communicator where the job's last rank alone has one setting (as a node whose profile sets it).

argv: NAME VALUE.  Prints ``CREATED <rank>`` when the communicator is made.
"""

import os
import sys

if os.environ.get('PMI_RANK') == str(int(os.environ.get('PMI_SIZE', '1')) - 1):
    os.environ[sys.argv[1]] = sys.argv[2]

import chainermn_comm  # noqa: E402  (after the setting)

comm = chainermn_comm.create_communicator('naive')
print('CREATED', comm.rank, flush=True)
comm.finalize()
