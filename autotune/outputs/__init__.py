"""What a finished study leaves for people beside the terminal: the dashboard note
(``notes``), the files attached to trials (``artifacts``) and the HTML report (``report``).
"""
